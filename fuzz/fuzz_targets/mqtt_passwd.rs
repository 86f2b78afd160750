//! Arbitrary text read as an MQTT password file (`mqtt.auth.password_file`: `user:hash` lines in the
//! mosquitto_passwd, argon2 and bcrypt forms): a clear error or a set of users, never a panic. (Verifying
//! passwords is left out: it runs the crates' hash functions, at costs the input could set very high.)
#![no_main]
use libfuzzer_sys::fuzz_target;
use portico_mqtt::auth::Users;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Users::parse(text, "fuzz.passwd");
    }
});
