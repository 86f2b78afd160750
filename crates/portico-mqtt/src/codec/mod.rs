//! The MQTT packet codec: [`Packet::decode`] takes one packet off the front of a connection's read buffer,
//! [`Packet::encode`] appends one to its write buffer, in MQTT 3.1, 3.1.1 or 5.0.
//!
//! One packet model serves the three versions: v5's reason codes and properties are there in every packet
//! and stay empty (Success, no properties) when read from a v3 connection; writing to a v3 connection leaves
//! them out, and maps reason codes onto v3's return codes where v3 has them (CONNACK, SUBACK).
//!
//! Decoding refuses everything the specification's normative statements forbid that can be seen in one
//! packet; each refusal carries the reason code to close the connection with ([`DecodeError::reason_code`]).
//! Rules that need a connection's state (the first packet is CONNECT, a second CONNECT, topic aliases, packet
//! identifiers in use, which side may send what) are the broker's.

mod auth;
mod connack;
mod connect;
mod disconnect;
mod error;
mod fixed_header;
mod packet_type;
mod properties;
mod property;
mod publish;
mod publish_ack;
mod qos;
mod reason;
mod suback;
mod subscribe;
pub mod topic;
mod unsuback;
mod unsubscribe;
mod version;
mod wire;

use std::num::NonZeroU16;

use bytes::{Buf, BytesMut};

pub use auth::Auth;
pub use connack::ConnAck;
pub use connect::{Connect, Will};
pub use disconnect::Disconnect;
pub use error::{DecodeError, EncodeError};
pub use packet_type::PacketType;
pub use properties::{
    AckProperties, AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties, PublishProperties,
    SubscribeProperties, UnsubscribeProperties, WillProperties,
};
pub use property::{PayloadFormat, PropertyId, SubscriptionId, UserProperty};
pub use publish::Publish;
pub use publish_ack::PublishAck;
pub use qos::QoS;
pub use reason::ReasonCode;
pub use suback::SubAck;
pub use subscribe::{RetainHandling, Subscribe, Subscription, SubscriptionOptions};
pub use unsuback::UnsubAck;
pub use unsubscribe::Unsubscribe;
pub use version::ProtocolVersion;
pub use wire::MAX_VAR_INT;

use wire::{var_int_len, Reader};

/// A Packet Identifier: never 0 [MQTT-2.2.1-3].
pub type PacketId = NonZeroU16;

/// The largest packet the protocol can frame: a five-byte fixed header and the largest Remaining Length.
pub const MAX_PACKET_SIZE: u32 = 1 + 4 + MAX_VAR_INT;

/// An MQTT control packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    /// Boxed: CONNECT is the largest packet and comes once per connection.
    Connect(Box<Connect>),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(PublishAck),
    PubRec(PublishAck),
    PubRel(PublishAck),
    PubComp(PublishAck),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    /// v5 only.
    Auth(Auth),
}

impl Packet {
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Connect(_) => PacketType::Connect,
            Packet::ConnAck(_) => PacketType::ConnAck,
            Packet::Publish(_) => PacketType::Publish,
            Packet::PubAck(_) => PacketType::PubAck,
            Packet::PubRec(_) => PacketType::PubRec,
            Packet::PubRel(_) => PacketType::PubRel,
            Packet::PubComp(_) => PacketType::PubComp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::SubAck(_) => PacketType::SubAck,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::UnsubAck(_) => PacketType::UnsubAck,
            Packet::PingReq => PacketType::PingReq,
            Packet::PingResp => PacketType::PingResp,
            Packet::Disconnect(_) => PacketType::Disconnect,
            Packet::Auth(_) => PacketType::Auth,
        }
    }

    /// Takes the packet at the front of `buf`, or returns `Ok(None)` and leaves `buf` as it was while the
    /// packet is incomplete. `version` is the connection's (CONNECT is read in the version it names, so before
    /// one has arrived any value will do). A packet larger than `max_packet_size` bytes, fixed header
    /// included, is refused as soon as its fixed header is complete, before its body is waited for.
    ///
    /// The packet's strings and payload share `buf`'s allocation: a `Publish::payload` keeps that part of the
    /// read buffer alive until the last subscriber's copy of it is written.
    pub fn decode(
        buf: &mut BytesMut,
        version: ProtocolVersion,
        max_packet_size: u32,
    ) -> Result<Option<Packet>, DecodeError> {
        let Some(header) = fixed_header::parse(buf, version, max_packet_size)? else { return Ok(None) };
        if buf.len() < header.packet_len() {
            return Ok(None);
        }
        let mut frame = buf.split_to(header.packet_len());
        frame.advance(header.header_len);
        let r = &mut Reader::new(frame.freeze(), header.packet_type);
        let packet = match header.packet_type {
            PacketType::Connect => Packet::Connect(Box::new(Connect::decode(r)?)),
            PacketType::ConnAck => Packet::ConnAck(ConnAck::decode(r, version)?),
            PacketType::Publish => Packet::Publish(Publish::decode(r, header.flags, version)?),
            PacketType::PubAck => Packet::PubAck(PublishAck::decode(r, version)?),
            PacketType::PubRec => Packet::PubRec(PublishAck::decode(r, version)?),
            PacketType::PubRel => Packet::PubRel(PublishAck::decode(r, version)?),
            PacketType::PubComp => Packet::PubComp(PublishAck::decode(r, version)?),
            PacketType::Subscribe => Packet::Subscribe(Subscribe::decode(r, version)?),
            PacketType::SubAck => Packet::SubAck(SubAck::decode(r, version)?),
            PacketType::Unsubscribe => Packet::Unsubscribe(Unsubscribe::decode(r, version)?),
            PacketType::UnsubAck => Packet::UnsubAck(UnsubAck::decode(r, version)?),
            PacketType::PingReq => {
                r.finish()?;
                Packet::PingReq
            }
            PacketType::PingResp => {
                r.finish()?;
                Packet::PingResp
            }
            PacketType::Disconnect => Packet::Disconnect(Disconnect::decode(r, version)?),
            PacketType::Auth => Packet::Auth(Auth::decode(r)?),
        };
        Ok(Some(packet))
    }

    /// The Remaining Length: the bytes after the fixed header.
    fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        match self {
            Packet::Connect(connect) => connect.body_len(),
            Packet::ConnAck(connack) => connack.body_len(version),
            Packet::Publish(publish) => publish.body_len(version),
            Packet::PubAck(ack) | Packet::PubRec(ack) | Packet::PubRel(ack) | Packet::PubComp(ack) => {
                ack.body_len(version)
            }
            Packet::Subscribe(subscribe) => subscribe.body_len(version),
            Packet::SubAck(suback) => suback.body_len(version),
            Packet::Unsubscribe(unsubscribe) => unsubscribe.body_len(version),
            Packet::UnsubAck(unsuback) => unsuback.body_len(version),
            Packet::PingReq | Packet::PingResp => Ok(0),
            Packet::Disconnect(disconnect) => disconnect.body_len(version),
            Packet::Auth(_) if !version.is_v5() => Err(EncodeError::NotInVersion { packet: PacketType::Auth, version }),
            Packet::Auth(auth) => auth.body_len(),
        }
    }

    fn checked_body_len(&self, version: ProtocolVersion) -> Result<u32, EncodeError> {
        let len = self.body_len(version)?;
        u32::try_from(len).ok().filter(|&len| len <= MAX_VAR_INT).ok_or(EncodeError::PacketTooLarge(len))
    }

    /// The packet's size on the wire in `version`, fixed header included: what a v5 peer's Maximum Packet
    /// Size is compared with before sending.
    pub fn encoded_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        let body = self.checked_body_len(version)?;
        Ok(1 + var_int_len(body) + body as usize)
    }

    /// Appends the packet to `out` as `version` writes it (CONNECT in its own version). On an error nothing
    /// is appended. Values are written as they are: the codec checks lengths, not the rules it enforces when
    /// decoding.
    pub fn encode(&self, version: ProtocolVersion, out: &mut BytesMut) -> Result<(), EncodeError> {
        let body = self.checked_body_len(version)?;
        out.reserve(1 + var_int_len(body) + body as usize);
        let flags = match self {
            Packet::Publish(publish) => publish.flags(),
            other => other.packet_type().required_flags(),
        };
        fixed_header::write(out, self.packet_type(), flags, body);
        let body_start = out.len();
        match self {
            Packet::Connect(connect) => connect.write_body(out),
            Packet::ConnAck(connack) => connack.write_body(version, out),
            Packet::Publish(publish) => publish.write_body(version, out),
            Packet::PubAck(ack) | Packet::PubRec(ack) | Packet::PubRel(ack) | Packet::PubComp(ack) => {
                ack.write_body(version, out)
            }
            Packet::Subscribe(subscribe) => subscribe.write_body(version, out),
            Packet::SubAck(suback) => suback.write_body(version, out),
            Packet::Unsubscribe(unsubscribe) => unsubscribe.write_body(version, out),
            Packet::UnsubAck(unsuback) => unsuback.write_body(version, out),
            Packet::PingReq | Packet::PingResp => {}
            Packet::Disconnect(disconnect) => disconnect.write_body(version, out),
            Packet::Auth(auth) => auth.write_body(out),
        }
        debug_assert_eq!(out.len() - body_start, body as usize, "{:?}'s length pass and writer disagree", self);
        Ok(())
    }
}
