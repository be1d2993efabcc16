//! Leader election on a Lease of the real API server: one holder at a
//! time, takeover after expiry, instant handover on release.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proxyfleet_kube::lease::{ElectionConfig, LeaderElector};
use proxyfleet_tests::{kube_admin_client, kube_test_namespace, wait_for};

fn candidate(client: &kube::Client, namespace: &str, identity: &str) -> LeaderElector {
    LeaderElector::new(
        client.clone(),
        namespace,
        ElectionConfig {
            lease: "proxyfleet-leader".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(2),
            renew_every: Duration::from_millis(200),
        },
    )
}

#[tokio::test]
async fn one_holder_at_a_time_and_takeover_after_expiry() {
    let client = kube_admin_client().await;
    let namespace = kube_test_namespace(&client, "pf-lease").await;
    let (a, b) = (candidate(&client, &namespace, "a"), candidate(&client, &namespace, "b"));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap(), "a valid lease is not taken");
    assert!(a.try_acquire_or_renew().await.unwrap(), "the holder renews");

    // a stops renewing: b takes over once the lease has expired.
    let took_over = wait_for(Duration::from_secs(10), || async {
        b.try_acquire_or_renew().await.unwrap().then_some(())
    })
    .await;
    assert!(took_over.is_some());
    assert!(!a.try_acquire_or_renew().await.unwrap(), "the old holder has lost it");

    b.release().await.unwrap();
    assert!(a.try_acquire_or_renew().await.unwrap(), "a released lease is free at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_takes_over_when_the_leader_stops() {
    let client = kube_admin_client().await;
    let namespace = kube_test_namespace(&client, "pf-handover").await;
    let leaders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut replicas = Vec::new();
    for identity in ["first", "second"] {
        let elector = candidate(&client, &namespace, identity);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (leaders, most) = (Arc::clone(&leaders), Arc::clone(&most));
        let led = Arc::new(AtomicUsize::new(0));
        let led_here = Arc::clone(&led);
        let task = tokio::spawn(async move {
            elector
                .run(
                    move |mut lost| {
                        let (leaders, most, led) =
                            (Arc::clone(&leaders), Arc::clone(&most), Arc::clone(&led_here));
                        async move {
                            let now = leaders.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            led.fetch_add(1, Ordering::SeqCst);
                            let _ = lost.wait_for(|lost| *lost).await;
                            leaders.fetch_sub(1, Ordering::SeqCst);
                        }
                    },
                    async {
                        let _ = stopped.await;
                    },
                )
                .await;
        });
        replicas.push((stop, task, led));
        // Let the first replica win before the second starts.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(replicas[0].2.load(Ordering::SeqCst), 1, "the first replica leads");
    assert_eq!(replicas[1].2.load(Ordering::SeqCst), 0, "the second one waits");

    let (stop, task, _) = replicas.remove(0);
    let _ = stop.send(());
    task.await.unwrap();
    let second = Arc::clone(&replicas[0].2);
    let took_over = wait_for(Duration::from_secs(10), || async {
        (second.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert!(took_over.is_some(), "the second replica takes over");
    assert_eq!(most.load(Ordering::SeqCst), 1, "never two leaders at once");

    let (stop, task, _) = replicas.remove(0);
    let _ = stop.send(());
    task.await.unwrap();
}
