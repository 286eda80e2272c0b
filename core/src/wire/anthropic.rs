//! The Anthropic Messages API wire format (to be written).
