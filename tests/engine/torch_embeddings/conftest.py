"""The export script needs torch, which is not a test dependency: never collected."""

collect_ignore = ["make_exports.py"]
