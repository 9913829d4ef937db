"""`compare --parallel` and sweeps as Ray Tune trials: how many run at once and what each
asks for (`plans`), and running them (`runs`)."""
