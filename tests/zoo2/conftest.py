"""The second zoo's export script needs torch and torchvision, which are not test dependencies: never collected."""

collect_ignore = ["make_zoo2.py"]
