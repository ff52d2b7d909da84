"""The layers' own tests: settings, signals, sources' parsing and reads, forecast, decision."""
