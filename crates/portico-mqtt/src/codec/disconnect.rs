//! DISCONNECT (specification 3.14): the last packet either side sends. Before v5 it is empty and only the
//! client sends it.

use bytes::{BufMut, BytesMut};

use super::error::{DecodeError, EncodeError};
use super::packet_type::PacketType;
use super::properties::DisconnectProperties;
use super::reason::ReasonCode;
use super::version::ProtocolVersion;
use super::wire::{reason_code, Reader};

/// A DISCONNECT packet. `reason` and `properties` are v5's; before v5 nothing of them is on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Disconnect {
    pub reason: ReasonCode,
    pub properties: DisconnectProperties,
}

impl Disconnect {
    /// A DISCONNECT with `reason` and no properties.
    pub fn new(reason: ReasonCode) -> Disconnect {
        Disconnect { reason, properties: DisconnectProperties::default() }
    }

    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<Disconnect, DecodeError> {
        let mut disconnect = Disconnect::default();
        if version.is_v5() {
            // 3.14.2.1: no reason means Normal disconnection; 3.14.2.2: below 2 bytes, no properties.
            if !r.is_empty() {
                let code = r.u8()?;
                disconnect.reason = reason_code(code, PacketType::Disconnect)?;
            }
            if !r.is_empty() {
                disconnect.properties = DisconnectProperties::decode(r)?;
            }
        }
        r.finish()?;
        Ok(disconnect)
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if !version.is_v5() {
            return Ok(0);
        }
        Ok(match (self.reason, self.properties.is_empty()) {
            (ReasonCode::Success, true) => 0,
            (_, true) => 1,
            (_, false) => 1 + self.properties.encoded_len()?,
        })
    }

    pub(crate) fn write_body(&self, version: ProtocolVersion, out: &mut BytesMut) {
        if !version.is_v5() {
            return;
        }
        let properties = !self.properties.is_empty();
        if self.reason != ReasonCode::Success || properties {
            out.put_u8(self.reason.value());
        }
        if properties {
            self.properties.write(out);
        }
    }
}
