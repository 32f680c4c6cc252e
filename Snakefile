# weaver-repro: one command from data to every paper table and figure (issue 5).
#   snakemake --cores all                         the CPU mini replication (config/config.yaml)
#   snakemake --cores all --configfile config/smoke.yaml
#   snakemake figures --cores 1                   tables and figures from the committed raw logs only
#   snakemake --report report.html                one HTML page with every figure and table of the last run
#   snakemake --profile profiles/slurm --configfile config/paper.yaml
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/peers.smk"  # after figures: `snakemake figures` stays logs-only


rule all:
    input:
        ARTIFACTS,
    default_target: True
