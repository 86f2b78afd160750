//! AUTH (specification 3.15, v5 only): a step of an extended authentication exchange.

use bytes::{BufMut, BytesMut};

use super::error::{DecodeError, EncodeError};
use super::packet_type::PacketType;
use super::properties::AuthProperties;
use super::reason::ReasonCode;
use super::wire::{reason_code, Reader};

/// An AUTH packet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Auth {
    pub reason: ReasonCode,
    pub properties: AuthProperties,
}

impl Auth {
    pub(crate) fn decode(r: &mut Reader) -> Result<Auth, DecodeError> {
        let mut auth = Auth::default();
        // 3.15.2.1: a Remaining Length of 0 means Success without properties.
        if !r.is_empty() {
            let code = r.u8()?;
            auth.reason = reason_code(code, PacketType::Auth)?;
        }
        if !r.is_empty() {
            auth.properties = AuthProperties::decode(r)?;
        }
        r.finish()?;
        Ok(auth)
    }

    pub(crate) fn body_len(&self) -> Result<usize, EncodeError> {
        if self.reason == ReasonCode::Success && self.properties.is_empty() {
            return Ok(0);
        }
        Ok(1 + self.properties.encoded_len()?)
    }

    pub(crate) fn write_body(&self, out: &mut BytesMut) {
        if self.reason == ReasonCode::Success && self.properties.is_empty() {
            return;
        }
        out.put_u8(self.reason.value());
        self.properties.write(out);
    }
}
