//! The `kubernetes` plugin through the real host runtime against the test
//! API server (`deploy/dev/kube-apiserver/start.sh`): HTTPS with the
//! cluster's CA, the bearer token injected by the host from a file that is
//! read on every request. The server has no kubelet, so pods stay Pending;
//! the tests write pod status through the status subresource as a kubelet
//! would.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use proxyfleet_core::credential::ProxyCredential;
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::{ErrorClass, Health, HealthReason, InstanceState, Provider, ProxySpec};
use proxyfleet_harness::SpecBuilder;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{
    KUBE_TEST_USER, kube_admin_client, kube_test_namespace, plugin, wait_for, workspace_root,
};
use serde_json::{Value, json};

/// What `start.sh` wrote into its env file.
struct KubeEnv {
    api_url: String,
    admin_token: String,
    user_token: String,
    ca_file: String,
}

fn kube_env() -> KubeEnv {
    let state = std::env::var_os("PROXYFLEET_KUBE_STATE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
            .join(".cache/proxyfleet/kube/state")
    });
    let path = state.join("kube.env");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!(
            "{}: {error}: start the test API server with deploy/dev/kube-apiserver/start.sh",
            path.display()
        )
    });
    let value = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('=').map(str::to_owned))
            .unwrap_or_else(|| panic!("{key} missing from {}", path.display()))
    };
    KubeEnv {
        api_url: value("KUBE_API_URL"),
        admin_token: value("KUBE_ADMIN_TOKEN"),
        user_token: value("KUBE_USER_TOKEN"),
        ca_file: value("KUBE_CA_FILE"),
    }
}

/// A providers file with one entry `kube` for `namespace`, the token read
/// from `token_file`.
fn entry_yaml(env: &KubeEnv, namespace: &str, token_file: &std::path::Path) -> String {
    format!(
        "providers:
  - name: kube
    plugin: kubernetes
    config:
      apiServer: {api}
      namespace: {namespace}
    limits: {{ timeout: 30s }}
    grants:
      caFile: {ca}
      http:
        - url: {api}
          allowAddresses: [127.0.0.0/8]
          credential: {{ header: authorization, valueTemplate: 'Bearer {{secret}}', secretFile: {token} }}
",
        api = env.api_url,
        ca = env.ca_file,
        token = token_file.display(),
    )
}

/// One provider entry `kube` of the real plugin, for `namespace`, with the
/// token in a file the test may rewrite.
struct Fixture {
    provider: Arc<dyn Provider>,
    token_file: PathBuf,
    _registry: Registry,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn new(namespace: &str, token: &str) -> Self {
        let env = kube_env();
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(plugin("kubernetes"), dir.path().join("kubernetes.wasm")).unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let yaml = entry_yaml(&env, namespace, &token_file);
        let config = ProvidersConfig::parse(&yaml).expect("valid providers file");
        let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
        let registry = Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new()))
            .await
            .expect("plugin directory readable");
        let provider = registry.provider("kube").expect("the kube entry is ready");
        Self { provider, token_file, _registry: registry, _dir: dir }
    }

    fn rotate_token(&self, token: &str) {
        std::fs::write(&self.token_file, format!("{token}\n")).unwrap();
    }
}

/// A fresh namespace whose default ServiceAccount exists: the 1.20
/// ServiceAccount admission plugin refuses pods until the
/// controller-manager has made it.
async fn namespace(client: &kube::Client, prefix: &str) -> String {
    let namespace = kube_test_namespace(client, prefix).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
    let ready = wait_for(Duration::from_secs(30), || async {
        accounts.get_opt("default").await.ok()?.map(drop)
    })
    .await;
    assert!(ready.is_some(), "no default ServiceAccount in {namespace}");
    namespace
}

fn spec(name: &str, namespace: &str) -> ProxySpec {
    let uid = format!("{name}-{namespace}");
    let mut spec = SpecBuilder::new(name).uid(&uid).namespace("egress").build();
    // The entry's default image; `debian-12` would need an `images` entry.
    spec.image = String::new();
    spec
}

fn pod_json(pod: &Pod) -> Value {
    serde_json::to_value(pod).unwrap()
}

/// A pod nobody's plugin made, named `name`, with `labels`.
fn foreign_pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}
    }))
    .unwrap()
}

fn issue(health: &Health, reason: HealthReason) -> Option<&str> {
    health.issues.iter().find(|issue| issue.reason == reason).map(|issue| issue.message.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_adopts_refuses_foreign_pods_lists_by_label_and_deletes_idempotently() {
    let admin = kube_admin_client().await;
    let ns = namespace(&admin, "pf-kube-plugin").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let f = Fixture::new(&ns, &kube_env().admin_token).await;

    let web = spec("web", &ns);
    let created = f.provider.create(&web).await.expect("create");
    assert_eq!(created.state, InstanceState::Provisioning, "no kubelet: the pod stays Pending");
    let (pod_namespace, pod_name) = created.provider_id.split_once('/').expect("namespace/name");
    assert_eq!(pod_namespace, ns);
    assert!(pod_name.starts_with("pf-"), "{pod_name}");
    assert_eq!(created.mark.as_ref().map(|mark| mark.uid.as_str()), Some(web.uid.as_str()));

    let pod = pod_json(&pods.get(pod_name).await.expect("the pod exists"));
    let labels = &pod["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/managed-by"], "proxyfleet");
    assert_eq!(labels["proxyfleet.io/uid"], web.uid.as_str());
    assert_eq!(labels["proxyfleet.io/entry"], "kube");
    assert_eq!(pod["metadata"]["annotations"]["proxyfleet.io/owner"], "egress/web");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["resources"]["requests"], json!({"cpu": "1", "memory": "512Mi"}));
    assert_eq!(container["readinessProbe"]["tcpSocket"]["port"], 3128);
    let security = &container["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);

    let again = f.provider.create(&web).await.expect("a second create adopts");
    assert_eq!(again.provider_id, created.provider_id);
    assert_eq!(pods.list(&Default::default()).await.unwrap().items.len(), 1, "still one pod");

    // A pod that holds the name derived from another Proxy's UID but is not
    // ours: learn the name from a create, then put a stranger there.
    let other = spec("other", &ns);
    let other_id = f.provider.create(&other).await.expect("create").provider_id;
    f.provider.delete(&other_id).await.expect("delete");
    let other_name = other_id.split_once('/').unwrap().1.to_owned();
    let gone = wait_for(Duration::from_secs(10), || async {
        pods.get_opt(&other_name).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "{other_name} not deleted");
    pods.create(&PostParams::default(), &foreign_pod(&other_name, json!({"app": "web"})))
        .await
        .unwrap();
    let conflict = f.provider.create(&other).await.expect_err("someone else's pod");
    assert_eq!(conflict.class, ErrorClass::Conflict, "{conflict}");
    assert!(conflict.message.contains(&other_name), "{conflict}");
    let missing = f.provider.get(&other_id).await.expect_err("not ours");
    assert_eq!(missing.class, ErrorClass::NotFound, "{missing}");
    f.provider.delete(&other_id).await.expect("deleting a stranger's pod is a no-op");
    assert!(pods.get_opt(&other_name).await.unwrap().is_some(), "the stranger's pod stays");

    // One more stranger wearing only our managed-by label.
    pods.create(
        &PostParams::default(),
        &foreign_pod("lookalike", json!({"app.kubernetes.io/managed-by": "proxyfleet"})),
    )
    .await
    .unwrap();
    let listed = f.provider.list().await.expect("list");
    let ids: Vec<&str> = listed.iter().map(|instance| instance.provider_id.as_str()).collect();
    assert_eq!(ids, vec![created.provider_id.as_str()]);
    assert_eq!(listed[0].mark.as_ref().map(|mark| mark.name.as_str()), Some("web"));

    f.provider.delete(&created.provider_id).await.expect("delete");
    let gone = wait_for(Duration::from_secs(10), || async {
        pods.get_opt(pod_name).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the pod is gone");
    let not_found = f.provider.get(&created.provider_id).await.expect_err("gone");
    assert_eq!(not_found.class, ErrorClass::NotFound, "{not_found}");
    f.provider.delete(&created.provider_id).await.expect("a second delete succeeds");
    assert!(f.provider.list().await.expect("list").is_empty());
}

/// A Proxy with a credential: the pod reads it from a Secret of its own,
/// owned by the pod, written again by an adopting create, and deleted with
/// the pod; the credential shows nowhere in the pod. Run as the test user
/// with the shipped Role, which must be enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_goes_into_a_secret_the_pod_owns_and_reads() {
    let admin = kube_admin_client().await;
    let ns = namespace(&admin, "pf-kube-auth").await;
    bind_plugin_rbac(&admin, &ns).await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let f = Fixture::new(&ns, &kube_env().user_token).await;

    let mut web = spec("web", &ns);
    web.proxy_auth = Some(ProxyCredential::parse("crawler:first-pw").unwrap());
    let created = f.provider.create(&web).await.expect("create with a credential");
    let pod_name = created.provider_id.split_once('/').unwrap().1.to_owned();
    let pod = pod_json(&pods.get(&pod_name).await.unwrap());
    assert!(!pod.to_string().contains("first-pw"), "the password is not in the pod: {pod}");
    let env = &pod["spec"]["containers"][0]["env"];
    assert_eq!(env[1]["valueFrom"]["secretKeyRef"]["name"], format!("{pod_name}-auth"));
    let read = |secret: &Secret, key: &str| {
        let bytes = &secret.data.as_ref().unwrap()[key].0;
        String::from_utf8(bytes.clone()).unwrap()
    };
    let secret = secrets.get(&format!("{pod_name}-auth")).await.expect("the pod's Secret");
    assert_eq!(
        (read(&secret, "username"), read(&secret, "password")),
        ("crawler".into(), "first-pw".into())
    );
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Pod", pod_name.as_str()));
    assert_eq!(Some(owner.uid.as_str()), pod["metadata"]["uid"].as_str());

    // A retried create adopts the pod and writes the Secret again.
    web.proxy_auth = Some(ProxyCredential::parse("crawler:second-pw").unwrap());
    let again = f.provider.create(&web).await.expect("an adopting create");
    assert_eq!(again.provider_id, created.provider_id);
    let secret = secrets.get(&format!("{pod_name}-auth")).await.unwrap();
    assert_eq!(read(&secret, "password"), "second-pw");

    f.provider.delete(&created.provider_id).await.expect("delete");
    let gone = wait_for(Duration::from_secs(10), || async {
        secrets.get_opt(&format!("{pod_name}-auth")).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the Secret goes with its pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_phase_and_readiness_map_to_instance_states() {
    let admin = kube_admin_client().await;
    let ns = namespace(&admin, "pf-kube-phase").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let f = Fixture::new(&ns, &kube_env().admin_token).await;
    let created = f.provider.create(&spec("phase", &ns)).await.expect("create");
    let name = created.provider_id.split_once('/').unwrap().1.to_owned();

    let set_status = |status: Value| {
        let pods = pods.clone();
        let name = name.clone();
        async move {
            pods.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .expect("status written");
        }
    };

    set_status(json!({
        "phase": "Running",
        "podIP": "10.244.1.7",
        "podIPs": [{"ip": "10.244.1.7"}],
        "conditions": [{"type": "Ready", "status": "True"}]
    }))
    .await;
    let running = f.provider.get(&created.provider_id).await.expect("get");
    assert_eq!(running.state, InstanceState::Running);
    assert_eq!(running.addresses, vec!["10.244.1.7".to_owned()]);
    assert_eq!(running.port, None, "the Proxy's own port");

    set_status(json!({"conditions": [{"type": "Ready", "status": "False"}]})).await;
    let not_ready = f.provider.get(&created.provider_id).await.expect("get");
    assert_eq!(not_ready.state, InstanceState::Provisioning);
    assert!(not_ready.addresses.is_empty());

    set_status(json!({"phase": "Failed", "reason": "Evicted"})).await;
    let failed = f.provider.get(&created.provider_id).await.expect("get");
    assert_eq!(failed.state, InstanceState::Failed);

    // A finalizer holds the pod in deletion, as a kubelet does while the
    // container stops.
    let hold = json!({"metadata": {"finalizers": ["proxyfleet.io/test-hold"]}});
    pods.patch(&name, &PatchParams::default(), &Patch::Merge(hold)).await.unwrap();
    pods.delete(&name, &Default::default()).await.unwrap();
    let deleting = f.provider.get(&created.provider_id).await.expect("get");
    assert_eq!(deleting.state, InstanceState::Deleting);
    let waiting = f.provider.create(&spec("phase", &ns)).await.expect_err("still there");
    assert_eq!(waiting.class, ErrorClass::Transient, "{waiting}");
    f.provider.delete(&created.provider_id).await.expect("a delete under way is enough");
    let release = json!({"metadata": {"finalizers": null}});
    pods.patch(&name, &PatchParams::default(), &Patch::Merge(release)).await.unwrap();
    let gone = wait_for(Duration::from_secs(10), || async {
        pods.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "released");
    let not_found = f.provider.get(&created.provider_id).await.expect_err("gone");
    assert_eq!(not_found.class, ErrorClass::NotFound, "{not_found}");
}

/// The Role and RoleBinding of deploy/kubernetes/plugin-kubernetes-rbac.yaml
/// in `namespace`, bound to the test user instead of the operator.
async fn bind_plugin_rbac(client: &kube::Client, namespace: &str) {
    let text = std::fs::read_to_string(
        workspace_root().join("deploy/kubernetes/plugin-kubernetes-rbac.yaml"),
    )
    .unwrap()
    .replace("proxyfleet-proxies", namespace);
    let user = json!([{ "kind": "User", "name": KUBE_TEST_USER, "apiGroup": "rbac.authorization.k8s.io" }]);
    for document in yaml_serde::Deserializer::from_str(&text) {
        let mut value: Value = serde::Deserialize::deserialize(document).unwrap();
        match value["kind"].as_str().unwrap() {
            "Role" => {
                let role: Role = serde_json::from_value(value).unwrap();
                Api::<Role>::namespaced(client.clone(), namespace)
                    .create(&PostParams::default(), &role)
                    .await
                    .unwrap();
            }
            "RoleBinding" => {
                value["subjects"] = user.clone();
                let binding: RoleBinding = serde_json::from_value(value).unwrap();
                Api::<RoleBinding>::namespaced(client.clone(), namespace)
                    .create(&PostParams::default(), &binding)
                    .await
                    .unwrap();
            }
            other => panic!("unexpected {other} in plugin-kubernetes-rbac.yaml"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_missing_permissions_and_namespaces_and_the_shipped_role_is_enough() {
    let admin = kube_admin_client().await;
    let env = kube_env();
    let ns = namespace(&admin, "pf-kube-check").await;

    let as_user = Fixture::new(&ns, &env.user_token).await;
    let health = as_user.provider.check().await;
    assert!(!health.healthy, "{health:?}");
    let denied = health
        .issues
        .iter()
        .find(|issue| {
            issue.reason == HealthReason::Unauthorized
                && issue.message.contains("pods in namespace")
        })
        .map(|issue| issue.message.as_str())
        .expect("an unauthorized issue naming the verbs");
    assert!(denied.contains("may not create, get, list, delete pods"), "{denied}");
    assert!(denied.contains(&ns), "{denied}");
    let refused = as_user.provider.create(&spec("user", &ns)).await.expect_err("no permission");
    assert_eq!(refused.class, ErrorClass::Unauthorized, "{refused}");
    assert!(refused.message.contains("cannot create resource \"pods\""), "{refused}");

    bind_plugin_rbac(&admin, &ns).await;
    let healthy = wait_for(Duration::from_secs(10), || async {
        let health = as_user.provider.check().await;
        (health.healthy && health.issues.is_empty()).then_some(health)
    })
    .await;
    assert!(
        healthy.is_some(),
        "the shipped Role is not enough: {:?}",
        as_user.provider.check().await
    );
    let created = as_user.provider.create(&spec("user", &ns)).await.expect("create as the user");
    assert_eq!(as_user.provider.list().await.expect("list").len(), 1);
    as_user.provider.get(&created.provider_id).await.expect("get");
    as_user.provider.delete(&created.provider_id).await.expect("delete");

    let as_admin = Fixture::new(&ns, &env.admin_token).await;
    let health = as_admin.provider.check().await;
    assert!(health.healthy && health.issues.is_empty(), "{health:?}");

    let missing = format!("{ns}-missing");
    let nowhere = Fixture::new(&missing, &env.admin_token).await;
    let health = nowhere.provider.check().await;
    assert!(!health.healthy, "{health:?}");
    let message = issue(&health, HealthReason::Misconfigured).expect("a misconfigured issue");
    assert!(message.contains(&format!("namespace `{missing}`")), "{message}");
    assert!(message.contains("does not exist"), "{message}");
    let error = nowhere.provider.create(&spec("nowhere", &ns)).await.expect_err("no namespace");
    assert_eq!(error.class, ErrorClass::InvalidConfig, "{error}");
    assert!(error.message.contains("config key `namespace`"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_file_is_read_on_every_request() {
    let admin = kube_admin_client().await;
    let env = kube_env();
    let ns = namespace(&admin, "pf-kube-rotate").await;
    let f = Fixture::new(&ns, "not-a-valid-token").await;

    let health = f.provider.check().await;
    assert!(!health.healthy, "{health:?}");
    assert!(issue(&health, HealthReason::Unauthorized).is_some(), "{health:?}");
    let rejected = f.provider.create(&spec("rotate", &ns)).await.expect_err("bad token");
    assert_eq!(rejected.class, ErrorClass::Unauthorized, "{rejected}");
    assert!(!rejected.message.contains("not-a-valid-token"), "no secret in errors: {rejected}");

    f.rotate_token(&env.admin_token);
    let created = f.provider.create(&spec("rotate", &ns)).await.expect("the new token works");
    assert!(f.provider.check().await.healthy);

    f.rotate_token("revoked");
    let error = f.provider.get(&created.provider_id).await.expect_err("revoked");
    assert_eq!(error.class, ErrorClass::Unauthorized, "{error}");

    f.rotate_token(&env.admin_token);
    f.provider.delete(&created.provider_id).await.expect("delete");
}

/// The plugin passes the conformance suite (`proxyfleet plugin test`'s)
/// against the test API server, as the test user with the shipped Role:
/// no kubelet runs, so its pods stay pending, which the suite allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_passes_the_conformance_suite() {
    let admin = kube_admin_client().await;
    let ns = namespace(&admin, "pf-kube-conformance").await;
    bind_plugin_rbac(&admin, &ns).await;
    let env = kube_env();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{}\n", env.user_token)).unwrap();
    let providers = ProvidersConfig::parse(&entry_yaml(&env, &ns, &token_file)).unwrap();
    let entry = providers.entries.into_iter().next().unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let revision = runtime.load_plugin(&plugin("kubernetes")).await.unwrap();
    let mut options = proxyfleet_conformance::Options::new(entry.config.clone(), spec("c", &ns));
    options.call_timeout = entry.limits.call_timeout;
    options.delete_wait = Duration::from_secs(30);
    let binder =
        proxyfleet_harness::EntryBinder::new(runtime, entry, revision, Arc::new(MemoryKv::new()));
    let provider = binder.bind_own().await.expect("the entry binds");
    let report = proxyfleet_conformance::run(provider, &binder, &options).await;
    assert!(report.passed(), "{}", report.text());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    assert!(pods.list(&Default::default()).await.unwrap().items.is_empty(), "pods left behind");
}
