"""PySpark analytics over captured traffic (issue 5). Never imports the proxy runtime."""
