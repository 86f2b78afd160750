//! One v5 property (specification 2.2.2.2): its identifier, its value type, and how a value is read, checked
//! and written. Which packet may carry which property is `properties.rs`'s business.

use std::num::{NonZeroU16, NonZeroU32};

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use super::error::{DecodeError, EncodeError};
use super::qos::QoS;
use super::topic::is_valid_topic_name;
use super::wire::{field_len, put_field, put_var_int, var_int_len, Reader, MAX_VAR_INT};

/// Payload Format Indicator: whether a payload claims to be UTF-8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PayloadFormat {
    /// 0: unspecified bytes.
    Unspecified = 0,
    /// 1: UTF-8 encoded character data.
    Utf8 = 1,
}

/// A Subscription Identifier: 1 to 268,435,455 (specification 3.8.2.1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionId(NonZeroU32);

impl SubscriptionId {
    /// The identifier `value`, if it is in range.
    pub fn new(value: u32) -> Option<SubscriptionId> {
        if value > MAX_VAR_INT {
            return None;
        }
        NonZeroU32::new(value).map(SubscriptionId)
    }

    pub fn get(self) -> u32 {
        self.0.get()
    }
}

/// A User Property: a name and a value, both UTF-8 strings. Names may repeat.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UserProperty {
    pub name: ByteString,
    pub value: ByteString,
}

/// A value type a property can have, with its wire representation.
pub(crate) trait PropertyValue: Sized {
    /// Reads the value of property `id`, refusing values the specification forbids for its type.
    fn read(r: &mut Reader, id: u8) -> Result<Self, DecodeError>;
    /// The value's bytes on the wire.
    fn wire_len(&self) -> usize;
    /// Refuses a value that cannot be written (a string over 65,535 bytes).
    fn check(&self) -> Result<(), EncodeError> {
        Ok(())
    }
    fn write(&self, out: &mut BytesMut);
}

impl PropertyValue for bool {
    /// The "0 or 1" bytes; any other value is a Protocol Error (e.g. 3.1.2.11.6, 3.2.2.3.5).
    fn read(r: &mut Reader, id: u8) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::InvalidPropertyValue(id)),
        }
    }
    fn wire_len(&self) -> usize {
        1
    }
    fn write(&self, out: &mut BytesMut) {
        out.put_u8(u8::from(*self));
    }
}

impl PropertyValue for PayloadFormat {
    fn read(r: &mut Reader, id: u8) -> Result<Self, DecodeError> {
        Ok(if bool::read(r, id)? { PayloadFormat::Utf8 } else { PayloadFormat::Unspecified })
    }
    fn wire_len(&self) -> usize {
        1
    }
    fn write(&self, out: &mut BytesMut) {
        out.put_u8(*self as u8);
    }
}

impl PropertyValue for QoS {
    /// Maximum QoS, the one QoS-valued property: 0 or 1, anything else a Protocol Error (3.2.2.3.4).
    fn read(r: &mut Reader, id: u8) -> Result<Self, DecodeError> {
        Ok(if bool::read(r, id)? { QoS::AtLeastOnce } else { QoS::AtMostOnce })
    }
    fn wire_len(&self) -> usize {
        1
    }
    fn write(&self, out: &mut BytesMut) {
        out.put_u8(*self as u8);
    }
}

impl PropertyValue for u16 {
    fn read(r: &mut Reader, _id: u8) -> Result<Self, DecodeError> {
        r.u16()
    }
    fn wire_len(&self) -> usize {
        2
    }
    fn write(&self, out: &mut BytesMut) {
        out.put_u16(*self);
    }
}

impl PropertyValue for NonZeroU16 {
    /// Receive Maximum and Topic Alias, where 0 is a Protocol Error (3.1.2.11.3, [MQTT-3.3.2-8]).
    fn read(r: &mut Reader, id: u8) -> Result<Self, DecodeError> {
        NonZeroU16::new(r.u16()?).ok_or(DecodeError::InvalidPropertyValue(id))
    }
    fn wire_len(&self) -> usize {
        2
    }
    fn write(&self, out: &mut BytesMut) {
        out.put_u16(self.get());
    }
}

impl PropertyValue for u32 {
    fn read(r: &mut Reader, _id: u8) -> Result<Self, DecodeError> {
        r.u32()
    }
    fn wire_len(&self) -> usize {
        4
    }
    fn write(&self, out: &mut BytesMut) {
        out.put_u32(*self);
    }
}

impl PropertyValue for NonZeroU32 {
    /// Maximum Packet Size, where 0 is a Protocol Error (3.1.2.11.4).
    fn read(r: &mut Reader, id: u8) -> Result<Self, DecodeError> {
        NonZeroU32::new(r.u32()?).ok_or(DecodeError::InvalidPropertyValue(id))
    }
    fn wire_len(&self) -> usize {
        4
    }
    fn write(&self, out: &mut BytesMut) {
        out.put_u32(self.get());
    }
}

impl PropertyValue for SubscriptionId {
    fn read(r: &mut Reader, id: u8) -> Result<Self, DecodeError> {
        SubscriptionId::new(r.var_int()?).ok_or(DecodeError::InvalidPropertyValue(id))
    }
    fn wire_len(&self) -> usize {
        var_int_len(self.get())
    }
    fn check(&self) -> Result<(), EncodeError> {
        // Unreachable through `new`; kept so that no future constructor can make a fifth length byte.
        if self.get() > MAX_VAR_INT {
            return Err(EncodeError::VarIntTooLarge(self.get()));
        }
        Ok(())
    }
    fn write(&self, out: &mut BytesMut) {
        put_var_int(out, self.get());
    }
}

impl PropertyValue for ByteString {
    fn read(r: &mut Reader, _id: u8) -> Result<Self, DecodeError> {
        r.utf8()
    }
    fn wire_len(&self) -> usize {
        2 + self.as_bytes().len()
    }
    fn check(&self) -> Result<(), EncodeError> {
        field_len(self.as_bytes()).map(drop)
    }
    fn write(&self, out: &mut BytesMut) {
        put_field(out, self.as_bytes());
    }
}

impl PropertyValue for Bytes {
    fn read(r: &mut Reader, _id: u8) -> Result<Self, DecodeError> {
        r.binary()
    }
    fn wire_len(&self) -> usize {
        2 + Bytes::len(self)
    }
    fn check(&self) -> Result<(), EncodeError> {
        field_len(self).map(drop)
    }
    fn write(&self, out: &mut BytesMut) {
        put_field(out, self);
    }
}

impl PropertyValue for UserProperty {
    fn read(r: &mut Reader, _id: u8) -> Result<Self, DecodeError> {
        Ok(UserProperty { name: r.utf8()?, value: r.utf8()? })
    }
    fn wire_len(&self) -> usize {
        4 + self.name.as_bytes().len() + self.value.as_bytes().len()
    }
    fn check(&self) -> Result<(), EncodeError> {
        field_len(self.name.as_bytes())?;
        field_len(self.value.as_bytes()).map(drop)
    }
    fn write(&self, out: &mut BytesMut) {
        put_field(out, self.name.as_bytes());
        put_field(out, self.value.as_bytes());
    }
}

macro_rules! define_properties {
    ($( $(#[$doc:meta])* $id:literal $variant:ident($ty:ty), )*) => {
        /// The property identifiers (specification 2.2.2.2, table 2-4).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum PropertyId {
            $( $(#[$doc])* $variant = $id, )*
        }

        /// One property with its value, as read from the wire.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub(crate) enum Property {
            $( $variant($ty), )*
        }

        impl Property {
            /// Reads one property: its identifier (a Variable Byte Integer) and its value.
            pub(crate) fn read(r: &mut Reader) -> Result<Property, DecodeError> {
                let property = match r.var_int()? {
                    $( $id => Property::$variant(<$ty as PropertyValue>::read(r, $id)?), )*
                    other => return Err(DecodeError::UnknownProperty(other)),
                };
                property.check()?;
                Ok(property)
            }

            pub(crate) fn id(&self) -> u8 {
                match self {
                    $( Property::$variant(_) => $id, )*
                }
            }
        }
    };
}

define_properties! {
    0x01 PayloadFormatIndicator(PayloadFormat),
    0x02 MessageExpiryInterval(u32),
    0x03 ContentType(ByteString),
    0x08 ResponseTopic(ByteString),
    0x09 CorrelationData(Bytes),
    0x0B SubscriptionIdentifier(SubscriptionId),
    0x11 SessionExpiryInterval(u32),
    0x12 AssignedClientIdentifier(ByteString),
    0x13 ServerKeepAlive(u16),
    0x15 AuthenticationMethod(ByteString),
    0x16 AuthenticationData(Bytes),
    0x17 RequestProblemInformation(bool),
    0x18 WillDelayInterval(u32),
    0x19 RequestResponseInformation(bool),
    0x1A ResponseInformation(ByteString),
    0x1C ServerReference(ByteString),
    0x1F ReasonString(ByteString),
    0x21 ReceiveMaximum(NonZeroU16),
    0x22 TopicAliasMaximum(u16),
    0x23 TopicAlias(NonZeroU16),
    0x24 MaximumQoS(QoS),
    0x25 RetainAvailable(bool),
    0x26 UserProperty(UserProperty),
    0x27 MaximumPacketSize(NonZeroU32),
    0x28 WildcardSubscriptionAvailable(bool),
    0x29 SubscriptionIdentifierAvailable(bool),
    0x2A SharedSubscriptionAvailable(bool),
}

impl Property {
    /// Rules on a value beyond its type's.
    fn check(&self) -> Result<(), DecodeError> {
        match self {
            // A Response Topic is a topic name: no wildcards [MQTT-3.3.2-14] (3.1.3.2.5 for the will's).
            Property::ResponseTopic(topic) if !is_valid_topic_name(topic) => {
                Err(DecodeError::TopicNameInvalid(topic.to_string()))
            }
            _ => Ok(()),
        }
    }
}

/// Where a property set keeps the values of one identifier: an `Option` for those that may appear once, a
/// `Vec` for those that may repeat (User Property; Subscription Identifier in a PUBLISH).
pub(crate) trait Slot<T> {
    fn put(&mut self, value: T, id: PropertyId) -> Result<(), DecodeError>;
    fn values(&self) -> &[T];
}

impl<T> Slot<T> for Option<T> {
    fn put(&mut self, value: T, id: PropertyId) -> Result<(), DecodeError> {
        if self.is_some() {
            return Err(DecodeError::DuplicateProperty(id as u8));
        }
        *self = Some(value);
        Ok(())
    }
    fn values(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T> Slot<T> for Vec<T> {
    fn put(&mut self, value: T, _id: PropertyId) -> Result<(), DecodeError> {
        self.push(value);
        Ok(())
    }
    fn values(&self) -> &[T] {
        self
    }
}
