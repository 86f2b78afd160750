//! HPACK header blocks as a peer sends them (`portico_h2::hpack`): arbitrary bytes cut into blocks that one
//! `Decoder` reads in turn, so its dynamic table carries from block to block, with a small table so that
//! evictions and size updates happen often: no panic; every block that decodes, written again with one
//! `Encoder` (whose dynamic table carries over too, sized by the same first byte as the peer's limit), decodes
//! with a second `Decoder` to the same fields.
#![no_main]
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use portico_h2::hpack::{Decoder, Encoder};

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fuzz_target!(|data: &[u8]| {
    // The first byte sets the advertised table size (0 to 510 bytes); then each block is preceded by its length
    // (one byte), the last one cut short by the end of the input.
    let Some((&size, mut rest)) = data.split_first() else { return };
    let mut decoder = Decoder::new(usize::from(size) * 2);
    let mut encoder = Encoder::new();
    encoder.set_peer_limit(usize::from(size) * 2);
    // The peer's decoder: it starts at the protocol's default of 4096 until it hears otherwise.
    let mut redecoder = Decoder::new(4096);
    while let Some((&len, tail)) = rest.split_first() {
        let (block, next) = tail.split_at(usize::from(len).min(tail.len()));
        rest = next;
        let mut fields: Fields = Vec::new();
        // After an error HTTP/2 drops the connection; going on here tries the decoder from a table left by a
        // block cut short.
        if decoder.decode(block, |n, v| fields.push((n.to_vec(), v.to_vec()))).is_err() {
            continue;
        }
        let mut dst = BytesMut::new();
        encoder.begin_block(&mut dst);
        for (i, (name, value)) in fields.iter().enumerate() {
            // `status` writes a number in decimal: only for values that are a u16 written that way.
            let status = std::str::from_utf8(value).ok().and_then(|v| v.parse::<u16>().ok());
            match status {
                Some(status) if name == b":status" && status.to_string().as_bytes() == value => {
                    encoder.status(status, &mut dst)
                }
                _ => encoder.field(name, value, i % 3 == 2, &mut dst),
            }
        }
        let mut again: Fields = Vec::new();
        if let Err(e) = redecoder.decode(&dst, |n, v| again.push((n.to_vec(), v.to_vec()))) {
            panic!("what Encoder wrote does not decode: {e}");
        }
        assert_eq!(again, fields, "re-encoded fields decode differently");
    }
});
