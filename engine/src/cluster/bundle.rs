//! Flow bundles: a flow with every file it reads, by content hash.
