//! CONNECT (specification 3.1): the first packet of a connection, and the one that names its protocol
//! version. Every other packet is read and written in the version a CONNECT announced.

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use super::error::{DecodeError, EncodeError};
use super::properties::{ConnectProperties, WillProperties};
use super::publish::payload_matches_format;
use super::qos::QoS;
use super::topic::is_valid_topic_name;
use super::version::ProtocolVersion;
use super::wire::{field_len, put_field, Reader};

const RESERVED: u8 = 0x01;
const CLEAN_START: u8 = 0x02;
const WILL: u8 = 0x04;
const WILL_QOS_SHIFT: u8 = 3;
const WILL_RETAIN: u8 = 0x20;
const PASSWORD: u8 = 0x40;
const USERNAME: u8 = 0x80;

/// A CONNECT packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    /// The version named by the protocol name and level; CONNECT is always written in its own version.
    pub version: ProtocolVersion,
    /// Clean Start (v5), Clean Session (3.1, 3.1.1).
    pub clean_start: bool,
    /// Seconds; 0 turns keep-alive off.
    pub keep_alive: u16,
    /// May be empty (the server then assigns one, or refuses per version).
    pub client_id: ByteString,
    pub will: Option<Will>,
    pub username: Option<ByteString>,
    pub password: Option<Bytes>,
    pub properties: ConnectProperties,
}

/// The Will Message a CONNECT leaves with the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Will {
    pub topic: ByteString,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    pub properties: WillProperties,
}

impl Will {
    /// Whether the payload is UTF-8 when the will's Payload Format Indicator says so (3.1.3.2.3; see
    /// [`super::Publish::payload_matches_format`]).
    pub fn payload_matches_format(&self) -> bool {
        payload_matches_format(self.properties.payload_format, &self.payload)
    }
}

impl Connect {
    pub(crate) fn decode(r: &mut Reader) -> Result<Connect, DecodeError> {
        let name = r.utf8()?;
        let level = r.u8()?;
        let version = ProtocolVersion::from_name_and_level(&name, level)
            .ok_or_else(|| DecodeError::UnsupportedProtocolVersion { name: name.to_string(), level })?;
        let flags = r.u8()?;
        if flags & RESERVED != 0 {
            return Err(DecodeError::ConnectReservedFlag); // [MQTT-3.1.2-3]
        }
        let has_will = flags & WILL != 0;
        let will_qos = (flags >> WILL_QOS_SHIFT) & 0b11;
        let will_retain = flags & WILL_RETAIN != 0;
        // Without a will, its QoS and Retain must be 0 [MQTT-3.1.2-11], [MQTT-3.1.2-13]; QoS 3 is not one
        // [MQTT-3.1.2-12]. (3.1.1 numbers these [MQTT-3.1.2-13..15].)
        if !has_will && (will_qos != 0 || will_retain) {
            return Err(DecodeError::InvalidWillFlags);
        }
        let will_qos = QoS::from_bits(will_qos).ok_or(DecodeError::InvalidWillFlags)?;
        let has_username = flags & USERNAME != 0;
        let has_password = flags & PASSWORD != 0;
        if has_password && !has_username && !version.is_v5() {
            return Err(DecodeError::PasswordWithoutUsername); // [MQTT-3.1.2-22]
        }
        let keep_alive = r.u16()?;
        let properties = if version.is_v5() { ConnectProperties::decode(r)? } else { ConnectProperties::default() };
        // 3.1.2.11.10: Authentication Data without an Authentication Method is a Protocol Error.
        if properties.authentication_data.is_some() && properties.authentication_method.is_none() {
            return Err(DecodeError::InvalidPropertyValue(0x16));
        }
        let client_id = r.utf8()?; // [MQTT-3.1.3-3]: present, first in the payload
        let will = if has_will {
            let properties = if version.is_v5() { WillProperties::decode(r)? } else { WillProperties::default() };
            let topic = r.utf8()?;
            if !is_valid_topic_name(&topic) {
                return Err(DecodeError::TopicNameInvalid(topic.to_string()));
            }
            let payload = r.binary()?;
            Some(Will { topic, payload, qos: will_qos, retain: will_retain, properties })
        } else {
            None
        };
        let username = if has_username { Some(r.utf8()?) } else { None };
        let password = if has_password { Some(r.binary()?) } else { None };
        r.finish()?;
        Ok(Connect {
            version,
            clean_start: flags & CLEAN_START != 0,
            keep_alive,
            client_id,
            will,
            username,
            password,
            properties,
        })
    }

    pub(crate) fn body_len(&self) -> Result<usize, EncodeError> {
        let v5 = self.version.is_v5();
        if self.password.is_some() && self.username.is_none() && !v5 {
            return Err(EncodeError::PasswordWithoutUsername);
        }
        // Protocol name, level, flags, keep alive.
        let mut len = field_len(self.version.protocol_name().as_bytes())? + 1 + 1 + 2;
        if v5 {
            len += self.properties.encoded_len()?;
        }
        len += field_len(self.client_id.as_bytes())?;
        if let Some(will) = &self.will {
            if v5 {
                len += will.properties.encoded_len()?;
            }
            len += field_len(will.topic.as_bytes())? + field_len(&will.payload)?;
        }
        if let Some(username) = &self.username {
            len += field_len(username.as_bytes())?;
        }
        if let Some(password) = &self.password {
            len += field_len(password)?;
        }
        Ok(len)
    }

    fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.clean_start {
            flags |= CLEAN_START;
        }
        if let Some(will) = &self.will {
            flags |= WILL | ((will.qos as u8) << WILL_QOS_SHIFT);
            if will.retain {
                flags |= WILL_RETAIN;
            }
        }
        if self.username.is_some() {
            flags |= USERNAME;
        }
        if self.password.is_some() {
            flags |= PASSWORD;
        }
        flags
    }

    pub(crate) fn write_body(&self, out: &mut BytesMut) {
        let v5 = self.version.is_v5();
        put_field(out, self.version.protocol_name().as_bytes());
        out.put_u8(self.version.level());
        out.put_u8(self.flags());
        out.put_u16(self.keep_alive);
        if v5 {
            self.properties.write(out);
        }
        put_field(out, self.client_id.as_bytes());
        if let Some(will) = &self.will {
            if v5 {
                will.properties.write(out);
            }
            put_field(out, will.topic.as_bytes());
            put_field(out, &will.payload);
        }
        if let Some(username) = &self.username {
            put_field(out, username.as_bytes());
        }
        if let Some(password) = &self.password {
            put_field(out, password);
        }
    }
}
