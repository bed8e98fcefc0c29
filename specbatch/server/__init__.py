"""Start and stop a real tritonserver over the specbatch model repositories."""
