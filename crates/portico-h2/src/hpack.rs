//! HPACK (RFC 7541): to be written.
