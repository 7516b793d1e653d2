"""The command line: `coscale run|demo|fit|eval`, its run configuration, the built-in demo and its report."""
