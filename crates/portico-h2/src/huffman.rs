//! HPACK's Huffman code (RFC 7541 Appendix B): to be written.
