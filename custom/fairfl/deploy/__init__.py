"""Deployment helpers: POC federations, completing provisioned startup kits, submitting jobs, the dashboard."""
