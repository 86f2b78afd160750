"""paho-mqtt (PyPI) against Portico's broker, run by tests/mqtt_clients.rs:

    python paho_client.py TRANSPORT HOST PORT VERSION TAG [will-child]

TRANSPORT is `tcp` or `websockets` (path /mqtt); VERSION 4 (MQTT 3.1.1) or 5. Prints `ok ...` per check and
`done` at the end; exits 1 with `FAILED: ...` on the first failure or after 20 s. With `will-child`, it only
connects with a will, says `connected`, and waits to be killed.
"""

import queue
import signal
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

transport, host, port, version, tag = sys.argv[1:6]
mode = sys.argv[6] if len(sys.argv) > 6 else None
protocol = mqtt.MQTTv5 if version == "5" else mqtt.MQTTv311
step = "start"


def fail(what):
    print(f"FAILED: {what}", flush=True)
    sys.exit(1)


def check(ok, what):
    if not ok:
        fail(what)


def on_alarm(*_):
    print(f"FAILED: timed out at: {step}", flush=True)
    sys.exit(1)


signal.signal(signal.SIGALRM, on_alarm)
signal.alarm(20)


class Client:
    """A paho client on its own network thread, its messages on a queue."""

    def __init__(self, client_id, will=None):
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, transport=transport, protocol=protocol
        )
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
        if will:
            self.c.will_set(*will)
        self.messages = queue.Queue()
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.granted = None
        self.c.on_connect = lambda c, u, flags, reason, props: self.connected.set()
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)

        def on_subscribe(c, u, mid, reasons, props):
            self.granted = reasons
            self.subscribed.set()

        self.c.on_subscribe = on_subscribe
        self.c.connect(host, int(port), keepalive=30)
        self.c.loop_start()
        check(self.connected.wait(5), f"{client_id} connected")

    def subscribe(self, topic, qos):
        self.subscribed.clear()
        self.c.subscribe(topic, qos=qos)
        check(self.subscribed.wait(5), f"SUBACK for {topic}")
        return self.granted

    def next(self, topic):
        while True:
            msg = self.messages.get(timeout=10)
            if msg.topic == topic:
                return msg

    def publish(self, topic, payload, qos, retain=False, properties=None):
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        info.wait_for_publish(5)
        check(info.is_published(), f"{topic} acknowledged")

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


if mode == "will-child":
    Client(f"{tag}-will", will=(f"{tag}/will", b"gone", 1, False))
    print("connected", flush=True)
    time.sleep(60)
    sys.exit(0)

step = "connect"
sub = Client(f"{tag}-sub")
pub = Client(f"{tag}-pub")
step = "subscribe"
granted = sub.subscribe(f"{tag}/#", 2)
check([int(getattr(g, "value", g)) for g in granted] == [2], f"granted {granted}")
for qos in (0, 1, 2):
    step = f"publish at QoS {qos}"
    pub.publish(f"{tag}/q{qos}", f"at {qos}".encode(), qos)
    m = sub.next(f"{tag}/q{qos}")
    check(m.payload == f"at {qos}".encode() and m.qos == qos, f"{step}: got {m.payload!r} at {m.qos}")
    print(f"ok QoS {qos}", flush=True)

step = "retained message"
pub.publish(f"{tag}-retained", b"kept", 1, retain=True)
late = Client(f"{tag}-late")
late.subscribe(f"{tag}-retained", 1)
m = late.next(f"{tag}-retained")
check(m.payload == b"kept" and m.retain, f"{step}: {m.payload!r} retain={m.retain}")
pub.publish(f"{tag}-retained", b"", 1, retain=True)  # cleared
print("ok retained", flush=True)

step = "will on an abrupt close"
child = subprocess.Popen(
    [sys.executable, __file__, transport, host, port, version, tag, "will-child"], stdout=subprocess.PIPE, text=True
)
check(child.stdout.readline().strip() == "connected", "the will client connected")
child.kill()
child.wait()
m = sub.next(f"{tag}/will")
check(m.payload == b"gone", f"{step}: {m.payload!r}")
print("ok will", flush=True)

if version == "5":
    step = "user properties"
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("sensor", "kitchen"), ("unit", "celsius"), ("unit", "rounded")]
    props.ContentType = "text/plain"
    props.CorrelationData = b"c-1"
    pub.publish(f"{tag}/props", b"21.5", 1, properties=props)
    m = sub.next(f"{tag}/props")
    got = m.properties
    check(
        got is not None
        and getattr(got, "UserProperty", None) == [("sensor", "kitchen"), ("unit", "celsius"), ("unit", "rounded")]
        and getattr(got, "ContentType", None) == "text/plain"
        and getattr(got, "CorrelationData", None) == b"c-1",
        f"{step}: {got}",
    )
    print("ok user properties", flush=True)

step = "disconnect"
for c in (sub, pub, late):
    c.close()
print("done", flush=True)
