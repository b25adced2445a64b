"""Jobs and their events: the job-file versions the watcher stores, set-based, and their reads."""
