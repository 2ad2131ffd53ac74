"""`fairfl report`: the papers' results table and figures from one or more runs' results.json files.

As in the papers' tables (Fed-LWR Tables 1-2), values are percent, Avg. is the mean over sites and Std. the
population standard deviation across sites. With several runs (seeds) of a method, each cell is the mean over
seeds ± their sample sd (ddof=1), and Std. is the mean over seeds of each run's across-site std. A second table
gives the spread over sites: worst and best site, percentiles, best - worst and the Gini coefficient.

Runs of one method with other free riders or other left-out sites are reported as separate rows. The FedCE
paper's fairness tables are added where the inputs allow: performance fairness against Solo (Table 2),
per-region Dice, client contributions (with a per-round figure), and, given a leave-one-out file, the
agreement of each method's contribution estimate with the leave-one-out values (Table 3).

runs: finding and loading runs, grouping them; statistics: their scores; markdown: table cells; site_tables,
global_model, fairness_tables: the tables; figures; parts: what a section or figure is, so that a method unit adds
those only its runs have (`fairfl.methods.<unit>.report`); document: report.md (`make_report`); command: the
command line. No torch or FLARE import anywhere in it (matplotlib only when a figure is drawn).
"""
