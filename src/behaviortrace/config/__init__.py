"""The run configuration: typed sections (sections.py), validation (validate.py), loading (load.py)."""
