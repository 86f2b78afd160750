//! The broker through the binary with the registries' MQTT clients: mqtt.js (the npm `mqtt` package, on
//! Node) and paho-mqtt (PyPI), each over TCP (`protocol: mqtt` listener) and WebSocket (`mqtt: websocket` on
//! the HTTP listener), MQTT 3.1.1 and 5.0 (and 3.1 for mqtt.js): connect, subscribe, publish and receive at
//! QoS 0, 1 and 2, a retained message, a will published when its client is killed, and v5 user properties,
//! content type and correlation data round-trip. The scenarios are scripts in tests/data (mqtt_js_client.js,
//! paho_client.py); `.ci/install-test-deps` installs both clients into target/test-tools.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn config() -> String {
    "workers: 2\nadmin: { address: \"{admin}\" }\nlisteners:\n  - name: web\n    address: \"{listen}\"\n  - name: mqtt\n    address: \"{mqtt}\"\n    protocol: mqtt\nroutes:\n  - match: { path: /mqtt }\n    mqtt: websocket\n".to_string()
}

fn test_tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools")
}

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(file)
}

/// Runs a client script; panics with what it printed unless it ended with `done`.
fn run(what: &str, command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.lines().last() == Some("done"),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

/// Every client the scripts opened was the broker's, the WebSocket ones too, and all of them have gone.
fn closed_all(p: &Portico, clients: u32) {
    wait_until("every client gone", std::time::Duration::from_secs(5), || p.metric("portico_mqtt_connections") == 0.0);
    assert_eq!(p.metric("portico_mqtt_connections_total"), f64::from(clients));
}

#[test]
fn mqtt_js_over_tcp_and_websocket_in_every_version() {
    let test = "mqtt_js_over_tcp_and_websocket_in_every_version";
    let module = test_tools().join("node_modules/mqtt");
    if !have_tool("node", test) {
        return;
    }
    if !module.join("package.json").exists() {
        return skip_outside_ci(
            test,
            "the npm package `mqtt` is not in target/test-tools (`bash .ci/install-test-deps`)",
        );
    }
    let p = Portico::start(&config());
    let tcp = format!("mqtt://{}", p.mqtt);
    let ws = format!("ws://{}/mqtt", p.addr);
    let mut runs = 0;
    for (url, transport) in [(&tcp, "tcp"), (&ws, "ws")] {
        for version in ["3", "4", "5"] {
            let tag = format!("js-{transport}-{version}");
            run(
                &format!("mqtt.js over {url}, protocol version {version}"),
                Command::new("node").arg(data("mqtt_js_client.js")).arg(&module).args([url.as_str(), version, &tag]),
            );
            runs += 1;
        }
    }
    // Three clients per run and the will's.
    closed_all(&p, runs * 4);
}

#[test]
fn paho_mqtt_over_tcp_and_websockets_in_v311_and_v5() {
    let test = "paho_mqtt_over_tcp_and_websockets_in_v311_and_v5";
    let python = test_tools().join("venv/bin/python");
    let imports = Command::new(&python).args(["-c", "import paho.mqtt.client"]).output();
    if !imports.is_ok_and(|o| o.status.success()) {
        return skip_outside_ci(test, "paho-mqtt is not in target/test-tools/venv (`bash .ci/install-test-deps`)");
    }
    let p = Portico::start(&config());
    let mut runs = 0;
    for (transport, addr) in [("tcp", p.mqtt), ("websockets", p.addr)] {
        for version in ["4", "5"] {
            let tag = format!("py-{transport}-{version}");
            let (host, port) = (addr.ip().to_string(), addr.port().to_string());
            run(
                &format!("paho-mqtt over {transport} to {addr}, protocol version {version}"),
                Command::new(&python).arg(data("paho_client.py")).args([transport, &host, &port, version, &tag]),
            );
            runs += 1;
        }
    }
    closed_all(&p, runs * 4);
}
