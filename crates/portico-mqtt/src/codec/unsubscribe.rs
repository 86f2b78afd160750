//! UNSUBSCRIBE (specification 3.10): the topic filters to remove.

use bytes::{BufMut, BytesMut};
use bytestring::ByteString;

use super::error::{DecodeError, EncodeError};
use super::packet_type::PacketType;
use super::properties::UnsubscribeProperties;
use super::topic::is_valid_topic_filter;
use super::version::ProtocolVersion;
use super::wire::{field_len, put_field, Reader};
use super::PacketId;

/// An UNSUBSCRIBE packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: PacketId,
    /// At least one [MQTT-3.10.3-2].
    pub filters: Vec<ByteString>,
    pub properties: UnsubscribeProperties,
}

impl Unsubscribe {
    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<Unsubscribe, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties =
            if version.is_v5() { UnsubscribeProperties::decode(r)? } else { UnsubscribeProperties::default() };
        let mut filters = Vec::new();
        while !r.is_empty() {
            let filter = r.utf8()?;
            if !is_valid_topic_filter(&filter, version.is_v5()) {
                return Err(DecodeError::TopicFilterInvalid(filter.to_string()));
            }
            filters.push(filter);
        }
        if filters.is_empty() {
            return Err(DecodeError::NoTopicFilters(PacketType::Unsubscribe));
        }
        Ok(Unsubscribe { packet_id, filters, properties })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        let mut len = 2;
        if version.is_v5() {
            len += self.properties.encoded_len()?;
        }
        for filter in &self.filters {
            len += field_len(filter.as_bytes())?;
        }
        Ok(len)
    }

    pub(crate) fn write_body(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id.get());
        if version.is_v5() {
            self.properties.write(out);
        }
        for filter in &self.filters {
            put_field(out, filter.as_bytes());
        }
    }
}
