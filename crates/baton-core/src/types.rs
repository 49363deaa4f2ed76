//! Validated newtypes.
