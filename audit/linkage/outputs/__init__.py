"""The report in each `--format`: text, JSON, SARIF, JUnit and GitHub annotations (`write.py`
parses the specs and writes each rendering), every untrusted string escaped for its destination."""
