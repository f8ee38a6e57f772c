//! Provider limits held across the workers of a store (SPEC §12).
