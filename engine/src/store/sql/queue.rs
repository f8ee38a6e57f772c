//! The work queue of submitted batches (SPEC §12): claims, leases, heartbeats, fencing.
