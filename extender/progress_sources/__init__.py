"""Progress sources other than SDK posts: container logs and Prometheus gauges (issue 17)."""
