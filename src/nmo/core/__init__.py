"""The operator's machinery: the kr8s boundary, watches, the work queue,
the maintenance planner and executor, drain, lease, leader election, events
and metrics."""
