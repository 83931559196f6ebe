"""The structured logging: context binding, options, the writer and the logfmt line format."""
