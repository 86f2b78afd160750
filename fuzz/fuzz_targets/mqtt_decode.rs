//! Arbitrary bytes read as a stream of MQTT packets in each version (3.1, 3.1.1, 5.0): no panic; every packet
//! that decodes encodes again (in the version it was read in) to exactly `encoded_len` bytes, which need more
//! input one byte short, and decode to the same packet.
#![no_main]
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use portico_mqtt::codec::{Packet, ProtocolVersion, MAX_PACKET_SIZE};

/// Small enough that the fuzzer also reaches the packet-too-large refusal.
const MAX_INPUT_PACKET: u32 = 16 * 1024;

fuzz_target!(|data: &[u8]| {
    for version in [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
        let mut input = BytesMut::from(data);
        while let Ok(Some(packet)) = Packet::decode(&mut input, version, MAX_INPUT_PACKET) {
            encodes_back(&packet, version);
        }
    }
});

fn encodes_back(packet: &Packet, version: ProtocolVersion) {
    let mut wire = BytesMut::new();
    if let Err(e) = packet.encode(version, &mut wire) {
        panic!("a decoded packet does not encode: {e}: {packet:?}");
    }
    assert_eq!(Ok(wire.len()), packet.encoded_len(version), "encoded_len disagrees with encode");

    let mut short = BytesMut::from(&wire[..wire.len() - 1]);
    assert_eq!(Packet::decode(&mut short, version, MAX_PACKET_SIZE), Ok(None), "one byte short is not partial");
    assert_eq!(short.len(), wire.len() - 1, "a partial packet was consumed");

    match Packet::decode(&mut wire, version, MAX_PACKET_SIZE) {
        Ok(Some(again)) => {
            assert!(wire.is_empty(), "the encoding is more than one packet");
            assert_eq!(&again, packet, "decode(encode(p)) != p");
        }
        Ok(None) => panic!("an encoded packet is partial: {packet:?}"),
        Err(e) => panic!("an encoded packet is refused: {e}: {packet:?}"),
    }
}
