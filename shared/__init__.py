"""Framework-neutral parts: config, copy-task data, weight exchange, checks, reporting, the `mhsa` CLI."""
