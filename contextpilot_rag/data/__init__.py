"""Data files shipped with the package (see ``NOTICE`` for their sources and licenses)."""
