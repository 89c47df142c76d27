"""The report: the study's tables with its numbers beside ours, PNG plots, and a hash-linked manifest.

- `inputs`: experiment and MLPerf manifests, read once, every link checked by hash;
- `reference`: the study's published numbers (config/study-reference.yaml);
- `format`: how numbers are written ("—" where none exists, never 0);
- `tables`: each study table, study rows beside ours, labelled simulated/measured;
- `plots`: throughput, paired ratios and cached share as PNGs;
- `build`: report.md, the plots and report.json. Nothing here runs an experiment.
"""

from parity.report.build import write_report

__all__ = ["write_report"]
