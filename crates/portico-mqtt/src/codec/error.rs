//! What the codec refuses, and the v5 reason code each refusal closes the connection with.

use super::packet_type::PacketType;
use super::reason::ReasonCode;

/// A packet the decoder refuses. The connection must be closed: with a v5 client, after a DISCONNECT (or,
/// before CONNACK, a CONNACK) carrying [`DecodeError::reason_code`]. The input buffer's state is unspecified.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The fixed header announces more bytes than the caller's maximum; nothing of the body was read.
    #[error("packet of {size} bytes exceeds the maximum of {maximum}")]
    PacketTooLarge { size: usize, maximum: u32 },
    /// A Variable Byte Integer longer than four bytes [MQTT-1.5.5-1].
    #[error("variable byte integer longer than four bytes")]
    VarIntTooLong,
    /// A Variable Byte Integer not in its shortest form [MQTT-1.5.5-1].
    #[error("variable byte integer not in its shortest form")]
    VarIntNotMinimal,
    /// Packet type 0, or 15 (AUTH) before v5.
    #[error("reserved packet type {0}")]
    ReservedPacketType(u8),
    /// Fixed-header flags the packet type does not allow [MQTT-2.1.3-1], a QoS of 3 [MQTT-3.3.1-4], or DUP
    /// on a QoS 0 PUBLISH [MQTT-3.3.1-2].
    #[error("invalid fixed header flags {flags:#06b} for {packet:?}")]
    InvalidFlags { packet: PacketType, flags: u8 },
    /// A field runs past the end of the packet.
    #[error("{0:?} ends inside a field")]
    Truncated(PacketType),
    /// Bytes left over after the last field of a packet.
    #[error("{0:?} has bytes after its last field")]
    TrailingBytes(PacketType),
    /// A string that is not well-formed UTF-8, or holds a UTF-16 surrogate [MQTT-1.5.4-1].
    #[error("string is not well-formed UTF-8")]
    InvalidUtf8,
    /// A string holding U+0000 [MQTT-1.5.4-2].
    #[error("string contains U+0000")]
    NullCharacter,
    /// CONNECT names a protocol or level the codec does not speak [MQTT-3.1.2-1], [MQTT-3.1.2-2]: the broker
    /// answers CONNACK "unsupported protocol version" (v3 return code 1) and closes.
    #[error("unsupported protocol {name:?} level {level}")]
    UnsupportedProtocolVersion { name: String, level: u8 },
    /// CONNECT's reserved flag is set [MQTT-3.1.2-3].
    #[error("CONNECT's reserved flag is set")]
    ConnectReservedFlag,
    /// Will QoS or Will Retain set without the Will Flag, or a Will QoS of 3 [MQTT-3.1.2-11..13].
    #[error("CONNECT's will flags are inconsistent")]
    InvalidWillFlags,
    /// A password without a user name, which 3.1 and 3.1.1 forbid [MQTT-3.1.2-22].
    #[error("password without a user name")]
    PasswordWithoutUsername,
    /// A property identifier the specification does not define.
    #[error("unknown property identifier {0:#04x}")]
    UnknownProperty(u32),
    /// A property the packet may not carry (specification 2.2.2.2: a Malformed Packet).
    #[error("property {id:#04x} is not allowed in {packet:?}")]
    PropertyNotAllowed { id: u8, packet: PacketType },
    /// A property that may appear once, appearing again.
    #[error("property {0:#04x} appears more than once")]
    DuplicateProperty(u8),
    /// A property value the specification calls a Protocol Error (a zero Receive Maximum, Topic Alias,
    /// Maximum Packet Size or Subscription Identifier, a Maximum QoS of 2, a flag other than 0 or 1,
    /// Authentication Data without an Authentication Method).
    #[error("invalid value for property {0:#04x}")]
    InvalidPropertyValue(u8),
    /// A reason or return code the packet may not carry.
    #[error("reason code {code:#04x} is not valid in {packet:?}")]
    InvalidReasonCode { code: u8, packet: PacketType },
    /// A packet identifier of 0 where one is required [MQTT-2.2.1-3].
    #[error("packet identifier 0 in {0:?}")]
    ZeroPacketId(PacketType),
    /// A topic name that is empty (before v5) or holds a wildcard [MQTT-3.3.2-2], [MQTT-4.7.3-1].
    #[error("invalid topic name {0:?}")]
    TopicNameInvalid(String),
    /// A v5 PUBLISH with an empty topic name and no Topic Alias (specification 3.3.2.1).
    #[error("PUBLISH has neither a topic name nor a topic alias")]
    MissingTopicName,
    /// A topic filter that is empty, or misplaces `+` or `#` [MQTT-4.7.1-1], [MQTT-4.7.1-2], or a shared
    /// subscription without a share name or filter [MQTT-4.8.2-1], [MQTT-4.8.2-2].
    #[error("invalid topic filter {0:?}")]
    TopicFilterInvalid(String),
    /// SUBSCRIBE or UNSUBSCRIBE without a topic filter [MQTT-3.8.3-3], [MQTT-3.10.3-2].
    #[error("{0:?} without a topic filter")]
    NoTopicFilters(PacketType),
    /// Subscription options with reserved bits set [MQTT-3.8.3-5] or a maximum QoS of 3.
    #[error("subscription options {0:#010b} set reserved bits")]
    InvalidSubscriptionOptions(u8),
    /// A Retain Handling of 3 (specification 3.8.3.1: a Protocol Error).
    #[error("retain handling 3")]
    InvalidRetainHandling,
    /// No Local on a shared subscription [MQTT-3.8.3-4].
    #[error("no local on a shared subscription")]
    NoLocalOnSharedSubscription,
    /// CONNACK's reserved flags are set [MQTT-3.2.2-1].
    #[error("CONNACK's reserved flags are set")]
    ConnAckReservedFlags,
    /// CONNACK with Session Present and a failure code [MQTT-3.2.2-4] (v5: [MQTT-3.2.2-6]).
    #[error("CONNACK with session present refuses the connection")]
    SessionPresentOnFailure,
}

impl DecodeError {
    /// The v5 reason code to close the connection with.
    pub fn reason_code(&self) -> ReasonCode {
        use DecodeError as E;
        match self {
            E::PacketTooLarge { .. } => ReasonCode::PacketTooLarge,
            E::UnsupportedProtocolVersion { .. } => ReasonCode::UnsupportedProtocolVersion,
            E::TopicNameInvalid(_) => ReasonCode::TopicNameInvalid,
            E::TopicFilterInvalid(_) => ReasonCode::TopicFilterInvalid,
            E::DuplicateProperty(_)
            | E::InvalidPropertyValue(_)
            | E::ZeroPacketId(_)
            | E::MissingTopicName
            | E::NoTopicFilters(_)
            | E::InvalidRetainHandling
            | E::NoLocalOnSharedSubscription
            | E::SessionPresentOnFailure => ReasonCode::ProtocolError,
            E::VarIntTooLong
            | E::VarIntNotMinimal
            | E::ReservedPacketType(_)
            | E::InvalidFlags { .. }
            | E::Truncated(_)
            | E::TrailingBytes(_)
            | E::InvalidUtf8
            | E::NullCharacter
            | E::ConnectReservedFlag
            | E::InvalidWillFlags
            | E::PasswordWithoutUsername
            | E::UnknownProperty(_)
            | E::PropertyNotAllowed { .. }
            | E::InvalidReasonCode { .. }
            | E::InvalidSubscriptionOptions(_)
            | E::ConnAckReservedFlags => ReasonCode::MalformedPacket,
        }
    }
}

/// A packet the encoder cannot write.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The packet would exceed the largest Remaining Length, 268,435,455 bytes.
    #[error("packet body of {0} bytes exceeds the largest remaining length")]
    PacketTooLarge(usize),
    /// A string or binary field longer than 65,535 bytes.
    #[error("field of {0} bytes exceeds 65,535")]
    FieldTooLong(usize),
    /// A Variable Byte Integer value above 268,435,455 (a Subscription Identifier).
    #[error("{0} does not fit a variable byte integer")]
    VarIntTooLarge(u32),
    /// A PUBLISH whose packet identifier does not match its QoS (one for QoS 1 and 2, none for QoS 0).
    #[error("PUBLISH packet identifier does not match its QoS")]
    PacketIdMismatch,
    /// A packet the version does not have (AUTH before v5).
    #[error("{packet:?} does not exist in MQTT {version}")]
    NotInVersion { packet: PacketType, version: super::ProtocolVersion },
    /// A password without a user name, which 3.1 and 3.1.1 forbid [MQTT-3.1.2-22].
    #[error("password without a user name")]
    PasswordWithoutUsername,
}
