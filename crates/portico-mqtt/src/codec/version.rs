//! The protocol versions the codec speaks, and how CONNECT names them.

use std::fmt;

/// An MQTT protocol version, as CONNECT's protocol name and level announce it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtocolVersion {
    /// MQTT 3.1: protocol name "MQIsdp", level 3.
    V3_1,
    /// MQTT 3.1.1: protocol name "MQTT", level 4.
    V3_1_1,
    /// MQTT 5.0: protocol name "MQTT", level 5.
    V5,
}

impl ProtocolVersion {
    /// The Protocol Level byte of CONNECT.
    pub fn level(self) -> u8 {
        match self {
            ProtocolVersion::V3_1 => 3,
            ProtocolVersion::V3_1_1 => 4,
            ProtocolVersion::V5 => 5,
        }
    }

    /// The Protocol Name string of CONNECT.
    pub fn protocol_name(self) -> &'static str {
        match self {
            ProtocolVersion::V3_1 => "MQIsdp",
            ProtocolVersion::V3_1_1 | ProtocolVersion::V5 => "MQTT",
        }
    }

    /// The version a CONNECT's protocol name and level announce, if the codec speaks it.
    pub fn from_name_and_level(name: &str, level: u8) -> Option<Self> {
        match (name, level) {
            ("MQIsdp", 3) => Some(ProtocolVersion::V3_1),
            ("MQTT", 4) => Some(ProtocolVersion::V3_1_1),
            ("MQTT", 5) => Some(ProtocolVersion::V5),
            _ => None,
        }
    }

    /// Whether packets carry v5 properties and reason codes.
    pub fn is_v5(self) -> bool {
        self == ProtocolVersion::V5
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProtocolVersion::V3_1 => "3.1",
            ProtocolVersion::V3_1_1 => "3.1.1",
            ProtocolVersion::V5 => "5.0",
        })
    }
}
