"""asyncrl-sweep's search mode: Optuna's samplers and pruners over asyncrl-train runs, the study in an RDB.

`spec` reads the sweep file (optuna-free), `progress` reads the trials' metrics.jsonl, `study` opens the Optuna
study, `trials` runs and prunes trials, `results` writes the best --config file, the table and the plots.
"""
