"""The controller runtime: reconciler, evictor, lease renewal, leader election
and the admission ledger."""
