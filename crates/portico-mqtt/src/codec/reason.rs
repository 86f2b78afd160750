//! MQTT 5.0 reason codes (specification 2.4), which packet may carry which, and how they map onto the return
//! codes of 3.1 and 3.1.1 (CONNACK and SUBACK are the only v3 packets with one).

use super::packet_type::PacketType;

/// A v5 reason code. 0x00 has three names in the specification (Success, Normal disconnection, Granted QoS
/// 0); here it is `Success`, with the other two as constants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ReasonCode {
    /// Also what a packet that leaves its reason code out means.
    #[default]
    Success = 0x00,
    GrantedQoS1 = 0x01,
    GrantedQoS2 = 0x02,
    DisconnectWithWillMessage = 0x04,
    NoMatchingSubscribers = 0x10,
    NoSubscriptionExisted = 0x11,
    ContinueAuthentication = 0x18,
    ReAuthenticate = 0x19,
    UnspecifiedError = 0x80,
    MalformedPacket = 0x81,
    ProtocolError = 0x82,
    ImplementationSpecificError = 0x83,
    UnsupportedProtocolVersion = 0x84,
    ClientIdentifierNotValid = 0x85,
    BadUserNameOrPassword = 0x86,
    NotAuthorized = 0x87,
    ServerUnavailable = 0x88,
    ServerBusy = 0x89,
    Banned = 0x8A,
    ServerShuttingDown = 0x8B,
    BadAuthenticationMethod = 0x8C,
    KeepAliveTimeout = 0x8D,
    SessionTakenOver = 0x8E,
    TopicFilterInvalid = 0x8F,
    TopicNameInvalid = 0x90,
    PacketIdentifierInUse = 0x91,
    PacketIdentifierNotFound = 0x92,
    ReceiveMaximumExceeded = 0x93,
    TopicAliasInvalid = 0x94,
    PacketTooLarge = 0x95,
    MessageRateTooHigh = 0x96,
    QuotaExceeded = 0x97,
    AdministrativeAction = 0x98,
    PayloadFormatInvalid = 0x99,
    RetainNotSupported = 0x9A,
    QoSNotSupported = 0x9B,
    UseAnotherServer = 0x9C,
    ServerMoved = 0x9D,
    SharedSubscriptionsNotSupported = 0x9E,
    ConnectionRateExceeded = 0x9F,
    MaximumConnectTime = 0xA0,
    SubscriptionIdentifiersNotSupported = 0xA1,
    WildcardSubscriptionsNotSupported = 0xA2,
}

use ReasonCode as R;

/// Which reason codes each packet may carry (specification table 2-6 and each packet's section).
const CONNACK: &[ReasonCode] = &[
    R::Success,
    R::UnspecifiedError,
    R::MalformedPacket,
    R::ProtocolError,
    R::ImplementationSpecificError,
    R::UnsupportedProtocolVersion,
    R::ClientIdentifierNotValid,
    R::BadUserNameOrPassword,
    R::NotAuthorized,
    R::ServerUnavailable,
    R::ServerBusy,
    R::Banned,
    R::BadAuthenticationMethod,
    R::TopicNameInvalid,
    R::PacketTooLarge,
    R::QuotaExceeded,
    R::PayloadFormatInvalid,
    R::RetainNotSupported,
    R::QoSNotSupported,
    R::UseAnotherServer,
    R::ServerMoved,
    R::ConnectionRateExceeded,
];
const PUBACK_PUBREC: &[ReasonCode] = &[
    R::Success,
    R::NoMatchingSubscribers,
    R::UnspecifiedError,
    R::ImplementationSpecificError,
    R::NotAuthorized,
    R::TopicNameInvalid,
    R::PacketIdentifierInUse,
    R::QuotaExceeded,
    R::PayloadFormatInvalid,
];
const PUBREL_PUBCOMP: &[ReasonCode] = &[R::Success, R::PacketIdentifierNotFound];
const SUBACK: &[ReasonCode] = &[
    R::Success,
    R::GrantedQoS1,
    R::GrantedQoS2,
    R::UnspecifiedError,
    R::ImplementationSpecificError,
    R::NotAuthorized,
    R::TopicFilterInvalid,
    R::PacketIdentifierInUse,
    R::QuotaExceeded,
    R::SharedSubscriptionsNotSupported,
    R::SubscriptionIdentifiersNotSupported,
    R::WildcardSubscriptionsNotSupported,
];
const UNSUBACK: &[ReasonCode] = &[
    R::Success,
    R::NoSubscriptionExisted,
    R::UnspecifiedError,
    R::ImplementationSpecificError,
    R::NotAuthorized,
    R::TopicFilterInvalid,
    R::PacketIdentifierInUse,
];
const DISCONNECT: &[ReasonCode] = &[
    R::Success,
    R::DisconnectWithWillMessage,
    R::UnspecifiedError,
    R::MalformedPacket,
    R::ProtocolError,
    R::ImplementationSpecificError,
    R::NotAuthorized,
    R::ServerBusy,
    R::ServerShuttingDown,
    R::KeepAliveTimeout,
    R::SessionTakenOver,
    R::TopicFilterInvalid,
    R::TopicNameInvalid,
    R::ReceiveMaximumExceeded,
    R::TopicAliasInvalid,
    R::PacketTooLarge,
    R::MessageRateTooHigh,
    R::QuotaExceeded,
    R::AdministrativeAction,
    R::PayloadFormatInvalid,
    R::RetainNotSupported,
    R::QoSNotSupported,
    R::UseAnotherServer,
    R::ServerMoved,
    R::SharedSubscriptionsNotSupported,
    R::ConnectionRateExceeded,
    R::MaximumConnectTime,
    R::SubscriptionIdentifiersNotSupported,
    R::WildcardSubscriptionsNotSupported,
];
const AUTH: &[ReasonCode] = &[R::Success, R::ContinueAuthentication, R::ReAuthenticate];

impl ReasonCode {
    /// 0x00 in DISCONNECT.
    pub const NORMAL_DISCONNECTION: ReasonCode = ReasonCode::Success;
    /// 0x00 in SUBACK.
    pub const GRANTED_QOS_0: ReasonCode = ReasonCode::Success;

    /// The code's byte.
    pub fn value(self) -> u8 {
        self as u8
    }

    /// Whether the code reports a failure (0x80 and above).
    pub fn is_error(self) -> bool {
        self.value() >= 0x80
    }

    /// The code for `value`, if the specification defines one.
    pub fn from_value(value: u8) -> Option<ReasonCode> {
        Some(match value {
            0x00 => R::Success,
            0x01 => R::GrantedQoS1,
            0x02 => R::GrantedQoS2,
            0x04 => R::DisconnectWithWillMessage,
            0x10 => R::NoMatchingSubscribers,
            0x11 => R::NoSubscriptionExisted,
            0x18 => R::ContinueAuthentication,
            0x19 => R::ReAuthenticate,
            0x80 => R::UnspecifiedError,
            0x81 => R::MalformedPacket,
            0x82 => R::ProtocolError,
            0x83 => R::ImplementationSpecificError,
            0x84 => R::UnsupportedProtocolVersion,
            0x85 => R::ClientIdentifierNotValid,
            0x86 => R::BadUserNameOrPassword,
            0x87 => R::NotAuthorized,
            0x88 => R::ServerUnavailable,
            0x89 => R::ServerBusy,
            0x8A => R::Banned,
            0x8B => R::ServerShuttingDown,
            0x8C => R::BadAuthenticationMethod,
            0x8D => R::KeepAliveTimeout,
            0x8E => R::SessionTakenOver,
            0x8F => R::TopicFilterInvalid,
            0x90 => R::TopicNameInvalid,
            0x91 => R::PacketIdentifierInUse,
            0x92 => R::PacketIdentifierNotFound,
            0x93 => R::ReceiveMaximumExceeded,
            0x94 => R::TopicAliasInvalid,
            0x95 => R::PacketTooLarge,
            0x96 => R::MessageRateTooHigh,
            0x97 => R::QuotaExceeded,
            0x98 => R::AdministrativeAction,
            0x99 => R::PayloadFormatInvalid,
            0x9A => R::RetainNotSupported,
            0x9B => R::QoSNotSupported,
            0x9C => R::UseAnotherServer,
            0x9D => R::ServerMoved,
            0x9E => R::SharedSubscriptionsNotSupported,
            0x9F => R::ConnectionRateExceeded,
            0xA0 => R::MaximumConnectTime,
            0xA1 => R::SubscriptionIdentifiersNotSupported,
            0xA2 => R::WildcardSubscriptionsNotSupported,
            _ => return None,
        })
    }

    /// Whether a v5 packet of type `packet` may carry this code.
    pub fn allowed_in(self, packet: PacketType) -> bool {
        let allowed = match packet {
            PacketType::ConnAck => CONNACK,
            PacketType::PubAck | PacketType::PubRec => PUBACK_PUBREC,
            PacketType::PubRel | PacketType::PubComp => PUBREL_PUBCOMP,
            PacketType::SubAck => SUBACK,
            PacketType::UnsubAck => UNSUBACK,
            PacketType::Disconnect => DISCONNECT,
            PacketType::Auth => AUTH,
            _ => return false,
        };
        allowed.contains(&self)
    }

    /// The 3.1 / 3.1.1 CONNACK return code (0 to 5) that says the most of this code. v3 has no word for most
    /// v5 refusals: they become "server unavailable" (3), or "not authorized" (5) when access was refused.
    pub fn to_v3_connect_return_code(self) -> u8 {
        match self {
            R::Success => 0,
            R::UnsupportedProtocolVersion => 1,
            R::ClientIdentifierNotValid => 2,
            R::BadUserNameOrPassword => 4,
            R::NotAuthorized | R::Banned | R::BadAuthenticationMethod => 5,
            _ => 3,
        }
    }

    /// The v5 code for a 3.1 / 3.1.1 CONNACK return code; `None` for the reserved 6 to 255.
    pub fn from_v3_connect_return_code(code: u8) -> Option<ReasonCode> {
        Some(match code {
            0 => R::Success,
            1 => R::UnsupportedProtocolVersion,
            2 => R::ClientIdentifierNotValid,
            3 => R::ServerUnavailable,
            4 => R::BadUserNameOrPassword,
            5 => R::NotAuthorized,
            _ => return None,
        })
    }

    /// The 3.1.1 SUBACK return code: the granted QoS, or 0x80 for any failure.
    pub fn to_v3_suback_return_code(self) -> u8 {
        match self {
            R::Success => 0,
            R::GrantedQoS1 => 1,
            R::GrantedQoS2 => 2,
            _ => 0x80,
        }
    }

    /// The v5 code for a 3.1 / 3.1.1 SUBACK return code; `None` for values the specification does not
    /// define [MQTT-3.9.3-2].
    pub fn from_v3_suback_return_code(code: u8) -> Option<ReasonCode> {
        Some(match code {
            0 => R::Success,
            1 => R::GrantedQoS1,
            2 => R::GrantedQoS2,
            0x80 => R::UnspecifiedError,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_defined_value_round_trips_and_nothing_else_decodes() {
        let mut defined = 0;
        for value in 0..=255u8 {
            if let Some(code) = ReasonCode::from_value(value) {
                assert_eq!(code.value(), value);
                defined += 1;
            }
        }
        // Specification 2.4 lists 43 distinct byte values.
        assert_eq!(defined, 43);
    }

    #[test]
    fn every_v3_return_code_maps_back_to_itself() {
        for code in 0..=5 {
            let reason = ReasonCode::from_v3_connect_return_code(code).unwrap();
            assert_eq!(reason.to_v3_connect_return_code(), code);
        }
        for code in [0, 1, 2, 0x80] {
            let reason = ReasonCode::from_v3_suback_return_code(code).unwrap();
            assert_eq!(reason.to_v3_suback_return_code(), code);
        }
    }

    #[test]
    fn allowed_sets_follow_table_2_6() {
        assert!(ReasonCode::PacketIdentifierNotFound.allowed_in(PacketType::PubRel));
        assert!(!ReasonCode::NoMatchingSubscribers.allowed_in(PacketType::PubRel));
        assert!(ReasonCode::DisconnectWithWillMessage.allowed_in(PacketType::Disconnect));
        assert!(!ReasonCode::DisconnectWithWillMessage.allowed_in(PacketType::ConnAck));
        assert!(ReasonCode::ReAuthenticate.allowed_in(PacketType::Auth));
        assert!(!ReasonCode::Success.allowed_in(PacketType::Publish));
    }
}
