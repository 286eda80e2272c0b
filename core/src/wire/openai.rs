//! The OpenAI Chat Completions wire format (to be written).
