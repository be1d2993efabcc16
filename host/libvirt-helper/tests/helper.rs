//! The helper against libvirt's built-in test driver (`test:///default`,
//! part of libvirt's client library, so no daemon is needed): requests in,
//! answers out, over a socket pair as over the operator's pipes.

use std::io::BufReader;
use std::os::unix::net::UnixStream;

use proxyfleet_libvirt_wire::{
    DomainState, ErrorCode, Handle, Op, Reply, Request, Value, read_frame, write_frame,
};

/// A helper serving one end of a socket pair on its own thread.
struct Helper {
    requests: UnixStream,
    replies: BufReader<UnixStream>,
    next: u64,
}

impl Helper {
    fn start() -> Self {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let output = theirs.try_clone().unwrap();
        std::thread::spawn(move || proxyfleet_libvirt_helper::serve(theirs, output));
        Self { replies: BufReader::new(ours.try_clone().unwrap()), requests: ours, next: 0 }
    }

    /// One call and its answer (calls here go one at a time).
    fn call(&mut self, op: Op) -> Result<Value, proxyfleet_libvirt_wire::WireError> {
        self.next += 1;
        write_frame(&mut self.requests, &Request { id: self.next, op }, &[]).unwrap();
        let (reply, _): (Reply, _) = read_frame(&mut self.replies).unwrap().unwrap();
        assert_eq!(reply.id, self.next);
        reply.outcome
    }

    fn handle(&mut self, op: Op) -> Handle {
        match self.call(op) {
            Ok(Value::Handle(handle)) => handle,
            other => panic!("expected a handle, got {other:?}"),
        }
    }
}

#[test]
fn calls_on_the_test_driver_answer_what_libvirt_does() {
    let mut helper = Helper::start();
    let conn = helper.handle(Op::Open { uri: "test:///default".into() });
    assert_eq!(helper.call(Op::IsAlive { conn }), Ok(Value::Bool(true)));
    assert!(
        matches!(helper.call(Op::Hostname { conn }), Ok(Value::Text(name)) if !name.is_empty())
    );

    // The test driver starts with one running domain called "test".
    let domain = helper.handle(Op::DomainByName { conn, name: "test".into() });
    assert_eq!(helper.call(Op::DomainName { domain }), Ok(Value::Text("test".into())));
    assert_eq!(helper.call(Op::DomainState { domain }), Ok(Value::State(DomainState::Running)));
    let Ok(Value::Handles(all)) = helper.call(Op::ListDomains { conn }) else { panic!() };
    assert_eq!(all.len(), 1);

    // Metadata round trip, and libvirt's own error code for none.
    let uri = "https://example.org/ns".to_owned();
    let missing = helper.call(Op::GetMetadata { domain, uri: uri.clone() }).unwrap_err();
    assert_eq!(missing.code, ErrorCode::NoDomainMetadata, "{missing:?}");
    helper
        .call(Op::SetMetadata {
            domain,
            uri: uri.clone(),
            key: "ex".into(),
            xml: Some("<mark v='1'/>".into()),
            config: false,
            live: true,
        })
        .unwrap();
    assert!(matches!(
        helper.call(Op::GetMetadata { domain, uri }),
        Ok(Value::Text(xml)) if xml.contains("mark") && xml.contains("v=\"1\"")
    ));

    let absent = helper.call(Op::DomainByName { conn, name: "absent".into() }).unwrap_err();
    assert_eq!(absent.code, ErrorCode::NoDomain, "{absent:?}");

    // A released handle is gone; a handle of the wrong kind is refused.
    assert_eq!(helper.call(Op::Release { handle: domain }), Ok(Value::Unit));
    let released = helper.call(Op::DomainName { domain }).unwrap_err();
    assert_eq!(released.code, ErrorCode::Helper, "{released:?}");
    let wrong = helper.call(Op::DomainName { domain: conn }).unwrap_err();
    assert_eq!(wrong.code, ErrorCode::Helper, "{wrong:?}");

    assert_eq!(helper.call(Op::Release { handle: conn }), Ok(Value::Unit));
}

#[test]
fn storage_calls_and_an_upload_stream_reach_the_test_driver() {
    let mut helper = Helper::start();
    let conn = helper.handle(Op::Open { uri: "test:///default".into() });
    // The test driver's pool "default-pool" starts empty.
    let pool = helper.handle(Op::PoolByName { conn, name: "default-pool".into() });
    assert_eq!(helper.call(Op::PoolActive { pool }), Ok(Value::Bool(true)));
    assert!(matches!(helper.call(Op::PoolInfo { pool }), Ok(Value::Pool(_))));
    let xml = "<volume><name>disk.raw</name><capacity>1048576</capacity></volume>";
    let volume = helper.handle(Op::CreateVolume { pool, xml: xml.into() });
    assert_eq!(helper.call(Op::VolumeName { volume }), Ok(Value::Text("disk.raw".into())));
    let Ok(Value::Volume(info)) = helper.call(Op::VolumeInfo { volume }) else { panic!() };
    assert_eq!(info.capacity, 1 << 20);
    // The test driver says so with a plain "operation failed".
    let again = helper.call(Op::CreateVolume { pool, xml: xml.into() }).unwrap_err();
    assert!(again.message.contains("already exists"), "{again:?}");
    let owner = helper.handle(Op::PoolByVolume { volume });
    assert_eq!(helper.call(Op::PoolName { pool: owner }), Ok(Value::Text("default-pool".into())));
    assert_eq!(helper.call(Op::DeleteVolume { volume }), Ok(Value::Unit));
    let gone = helper.call(Op::VolumeByName { pool, name: "disk.raw".into() }).unwrap_err();
    assert_eq!(gone.code, ErrorCode::NoStorageVolume, "{gone:?}");

    let stream = helper.handle(Op::NewStream { conn });
    assert_eq!(helper.call(Op::Abort { stream }), Ok(Value::Unit));
    let ended = helper.call(Op::Finish { stream }).unwrap_err();
    assert_eq!(ended.code, ErrorCode::Helper, "{ended:?}");
}

#[test]
fn the_helper_ends_when_its_input_does() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let output = theirs.try_clone().unwrap();
    let serving = std::thread::spawn(move || proxyfleet_libvirt_helper::serve(theirs, output));
    drop(ours);
    assert!(serving.join().unwrap().is_ok());
}
