use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::*;

#[derive(Clone, Debug)]
struct Sub(u64, Arc<AtomicBool>);

impl Subscriber for Sub {
    fn key(&self) -> u64 {
        self.0
    }
    fn is_online(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }
}

fn sub(key: u64) -> Sub {
    Sub(key, Arc::new(AtomicBool::new(true)))
}

fn opts(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions { qos, ..SubscriptionOptions::default() }
}

fn keys(router: &Router<Sub>, topic: &str) -> Vec<u64> {
    let mut out = Vec::new();
    router.route(topic, None, &mut out);
    let mut keys: Vec<u64> = out.iter().map(|r| r.subscriber.key()).collect();
    keys.sort_unstable();
    keys
}

#[test]
fn literal_plus_and_hash_filters_match() {
    let router = Router::new();
    router.subscribe("sport/tennis/player1", sub(1), opts(QoS::AtMostOnce), None);
    router.subscribe("sport/tennis/+", sub(2), opts(QoS::AtMostOnce), None);
    router.subscribe("sport/#", sub(3), opts(QoS::AtMostOnce), None);
    router.subscribe("#", sub(4), opts(QoS::AtMostOnce), None);
    router.subscribe("+/+/+/+", sub(5), opts(QoS::AtMostOnce), None);
    assert_eq!(keys(&router, "sport/tennis/player1"), [1, 2, 3, 4]);
    assert_eq!(keys(&router, "sport"), [3, 4]);
    assert_eq!(keys(&router, "sport/tennis/player1/ranking"), [3, 4, 5]);
    assert_eq!(keys(&router, "other"), [4]);
    assert_eq!(router.len(), 5);
}

#[test]
fn dollar_topics_are_not_matched_by_leading_wildcards_mqtt_4_7_2_1() {
    let router = Router::new();
    router.subscribe("#", sub(1), opts(QoS::AtMostOnce), None);
    router.subscribe("+/broker/uptime", sub(2), opts(QoS::AtMostOnce), None);
    router.subscribe("$SYS/#", sub(3), opts(QoS::AtMostOnce), None);
    assert_eq!(keys(&router, "$SYS/broker/uptime"), [3]);
}

#[test]
fn overlapping_subscriptions_are_merged_with_the_highest_qos_and_every_identifier() {
    let router = Router::new();
    router.subscribe("a/+", sub(1), opts(QoS::AtMostOnce), SubscriptionId::new(7));
    router.subscribe("a/#", sub(1), opts(QoS::ExactlyOnce), SubscriptionId::new(9));
    let mut out = Vec::new();
    router.route("a/b", None, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].max_qos, QoS::ExactlyOnce);
    let mut ids: Vec<u32> = out[0].subscription_ids.iter().map(|id| id.get()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [7, 9]);
}

#[test]
fn resubscribing_replaces_the_options() {
    let router = Router::new();
    assert!(!router.subscribe("a", sub(1), opts(QoS::AtMostOnce), None));
    assert!(router.subscribe("a", sub(1), opts(QoS::AtLeastOnce), None));
    let mut out = Vec::new();
    router.route("a", None, &mut out);
    assert_eq!(out[0].max_qos, QoS::AtLeastOnce);
    assert_eq!(router.len(), 1);
}

#[test]
fn no_local_skips_the_publishers_own_subscription_mqtt_3_8_3_3() {
    let router = Router::new();
    let options = SubscriptionOptions { no_local: true, ..opts(QoS::AtMostOnce) };
    router.subscribe("a", sub(1), options, None);
    router.subscribe("a", sub(2), options, None);
    let mut out = Vec::new();
    router.route("a", Some(1), &mut out);
    assert_eq!(out.iter().map(|r| r.subscriber.key()).collect::<Vec<_>>(), [2]);
}

#[test]
fn unsubscribe_removes_and_prunes() {
    let router = Router::new();
    router.subscribe("a/b/c", sub(1), opts(QoS::AtMostOnce), None);
    router.subscribe("$share/g/a/b/c", sub(2), opts(QoS::AtMostOnce), None);
    assert!(router.unsubscribe("a/b/c", 1));
    assert!(!router.unsubscribe("a/b/c", 1));
    assert!(router.unsubscribe("$share/g/a/b/c", 2));
    assert!(router.is_empty());
    assert!(router.root.read().unwrap().is_empty(), "empty nodes are pruned");
}

#[test]
fn a_shared_group_delivers_each_message_to_one_member_in_turn() {
    let router = Router::new();
    router.subscribe("$share/g/a/+", sub(1), opts(QoS::AtLeastOnce), None);
    router.subscribe("$share/g/a/+", sub(2), opts(QoS::AtLeastOnce), None);
    router.subscribe("$share/h/a/#", sub(3), opts(QoS::AtLeastOnce), None);
    router.subscribe("a/b", sub(1), opts(QoS::AtMostOnce), None);
    let mut counts = [0usize; 4];
    for _ in 0..10 {
        let mut out = Vec::new();
        router.route("a/b", None, &mut out);
        let shared: Vec<&Route<Sub>> = out.iter().filter(|r| r.shared).collect();
        assert_eq!(shared.len(), 2, "one member of each group");
        assert_eq!(out.iter().filter(|r| !r.shared).count(), 1, "the ordinary subscription is apart");
        for route in shared {
            counts[route.subscriber.key() as usize] += 1;
        }
    }
    assert_eq!(counts, [0, 5, 5, 10]);
}

#[test]
fn a_shared_group_prefers_connected_members() {
    let router = Router::new();
    let offline = Sub(1, Arc::new(AtomicBool::new(false)));
    router.subscribe("$share/g/a", offline, opts(QoS::AtLeastOnce), None);
    router.subscribe("$share/g/a", sub(2), opts(QoS::AtLeastOnce), None);
    for _ in 0..5 {
        assert_eq!(keys(&router, "a"), [2]);
    }
}

/// A realistic table: 100,000 subscriptions from 10,000 devices' clients and dashboards, a fifth of them with
/// wildcards; names drawn from the same space, most matching a few subscriptions.
/// `cargo test --release -p portico-mqtt bench_matches_per_second -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_matches_per_second() {
    let router = Arc::new(Router::new());
    let mut rng = fastrand::Rng::with_seed(7);
    for i in 0..100_000u64 {
        let device = rng.u32(0..10_000);
        let sensor = rng.u32(0..10);
        let filter = match i % 10 {
            0 => format!("site/{}/+/sensor/{sensor}", device % 100),
            1 => format!("site/{}/device/{device}/#", device % 100),
            _ => format!("site/{}/device/{device}/sensor/{sensor}", device % 100),
        };
        router.subscribe(&filter, sub(i), opts(QoS::AtLeastOnce), None);
    }
    router.subscribe("#", sub(1_000_000), opts(QoS::AtMostOnce), None);
    let topics: Vec<String> = (0..10_000)
        .map(|_| {
            let device = rng.u32(0..10_000);
            format!("site/{}/device/{device}/sensor/{}", device % 100, rng.u32(0..10))
        })
        .collect();
    let topics = Arc::new(topics);
    for threads in [1, 2] {
        let start = Instant::now();
        let per_thread = 500_000;
        let matched: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let router = router.clone();
                    let topics = topics.clone();
                    scope.spawn(move || {
                        let mut out = Vec::new();
                        let mut matched = 0;
                        for i in 0..per_thread {
                            out.clear();
                            router.route(&topics[(i * 7 + t * 13) % topics.len()], None, &mut out);
                            matched += out.len();
                        }
                        matched
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let elapsed = start.elapsed();
        let total = per_thread * threads;
        println!(
            "router: {} subscriptions, {threads} thread(s): {:.2} M matches/s ({:.0} ns per match, {:.1} routes per match)",
            router.len(),
            total as f64 / elapsed.as_secs_f64() / 1e6,
            elapsed.as_nanos() as f64 / total as f64 * threads as f64,
            matched as f64 / total as f64,
        );
    }
}
