//! CONNACK (specification 3.2): the server's answer to CONNECT.

use bytes::{BufMut, BytesMut};

use super::error::{DecodeError, EncodeError};
use super::packet_type::PacketType;
use super::properties::ConnAckProperties;
use super::reason::ReasonCode;
use super::version::ProtocolVersion;
use super::wire::Reader;

const SESSION_PRESENT: u8 = 0x01;

/// A CONNACK packet. Before v5 the reason is one of the six return codes, mapped onto v5 codes
/// ([`ReasonCode::from_v3_connect_return_code`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnAck {
    /// Always false in 3.1, which has no such flag.
    pub session_present: bool,
    pub reason: ReasonCode,
    pub properties: ConnAckProperties,
}

impl ConnAck {
    /// A CONNACK accepting the connection.
    pub fn accepted(session_present: bool) -> ConnAck {
        ConnAck { session_present, reason: ReasonCode::Success, properties: ConnAckProperties::default() }
    }

    /// A CONNACK refusing the connection with `reason`.
    pub fn refused(reason: ReasonCode) -> ConnAck {
        ConnAck { session_present: false, reason, properties: ConnAckProperties::default() }
    }

    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<ConnAck, DecodeError> {
        let flags = r.u8()?;
        let session_present = match version {
            // 3.1's first byte is "reserved, not used".
            ProtocolVersion::V3_1 => false,
            _ if flags & !SESSION_PRESENT != 0 => return Err(DecodeError::ConnAckReservedFlags), // [MQTT-3.2.2-1]
            _ => flags & SESSION_PRESENT != 0,
        };
        let code = r.u8()?;
        let reason = if version.is_v5() {
            ReasonCode::from_value(code).filter(|reason| reason.allowed_in(PacketType::ConnAck))
        } else {
            ReasonCode::from_v3_connect_return_code(code)
        };
        let reason = reason.ok_or(DecodeError::InvalidReasonCode { code, packet: PacketType::ConnAck })?;
        if session_present && reason != ReasonCode::Success {
            return Err(DecodeError::SessionPresentOnFailure); // [MQTT-3.2.2-4], v5 [MQTT-3.2.2-6]
        }
        let properties = if version.is_v5() { ConnAckProperties::decode(r)? } else { ConnAckProperties::default() };
        r.finish()?;
        Ok(ConnAck { session_present, reason, properties })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        Ok(2 + if version.is_v5() { self.properties.encoded_len()? } else { 0 })
    }

    pub(crate) fn write_body(&self, version: ProtocolVersion, out: &mut BytesMut) {
        let session_present = self.session_present && version != ProtocolVersion::V3_1;
        out.put_u8(if session_present { SESSION_PRESENT } else { 0 });
        if version.is_v5() {
            out.put_u8(self.reason.value());
            self.properties.write(out);
        } else {
            out.put_u8(self.reason.to_v3_connect_return_code());
        }
    }
}
