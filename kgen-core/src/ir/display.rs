//! The IR's text form.
