"""FedRDN's task fields: the switch every task carries, the sites' statistics the server sends with `train`, and a
site's own statistics in its answer (fairfl.methods.fedrdn.normalization: one record per site)."""

# server -> site
FEDRDN = "fedrdn"  # every task: train on images normalised with a random site's statistics, score with its own
FEDRDN_STATISTICS = "fedrdn_statistics"  # train: {site: statistics record} of every site whose statistics the
# server accepted so far (absent before it has any)

# site -> server
SITE_STATISTICS = "fedrdn_site_statistics"  # train: the statistics record of the site's own training images
