//! Base images: one per entry, image key and storage pool, named
//! `base-<entry>-<key>.<format>`, that every proxy's overlay sits on.
//!
//! A base is downloaded through the HTTP capability, hashed while it
//! streams into a temporary volume (`….part`), and only published (cloned
//! to its final name) when its digest matches the config. The entry's
//! key-value store records each base's digest and whether its copy to the
//! final name completed: a base is used only once it has, so an overlay
//! never sits on a half-copied base, and a copy cut off (by the call's
//! budget, a crash) is redone by the next upload. A published base whose
//! digest is not the config's is an error naming both digests, and the
//! base is left alone, since overlays may sit on it.
//!
//! One upload per base at a time: a lease in the key-value store, which
//! expires with the call that took it, so a crashed upload is taken over
//! (and its temporary volume removed) by the next.

use proxyfleet_sdk::http::Request;
use proxyfleet_sdk::kv::{self, CasOutcome};
use proxyfleet_sdk::libvirt::{self, LibvirtError, Volume};
use proxyfleet_sdk::{CallContext, ProviderError, Result, log};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Image;
use crate::lease::Lease;
use crate::xml;

/// Where one base lives.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    pub host: &'a str,
    pub pool: &'a str,
}

/// The base's volume name.
pub fn base_name(entry: &str, key: &str, image: &Image) -> String {
    format!("base-{entry}-{key}.{}", image.format.as_str())
}

fn record_key(place: Place<'_>, name: &str) -> String {
    format!("base/{}/{}/{name}", place.host.to_ascii_lowercase(), place.pool)
}

fn lease_key(place: Place<'_>, name: &str) -> String {
    format!("base-upload/{}/{}/{name}", place.host.to_ascii_lowercase(), place.pool)
}

/// What the store remembers of a base.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The verified digest of the image the base was copied from.
    pub sha256: String,
    /// Whether the copy to the final name completed.
    pub published: bool,
}

/// What the store records for a base, if anything.
pub fn record(place: Place<'_>, name: &str) -> Result<Option<Record>> {
    Ok(kv::get(&record_key(place, name))?
        .and_then(|entry| serde_json::from_slice::<Record>(&entry.value).ok()))
}

/// The error for a base whose recorded digest is not the configured one.
pub fn mismatch(
    place: Place<'_>,
    name: &str,
    key: &str,
    found: &str,
    expected: &str,
) -> ProviderError {
    ProviderError::Permanent(format!(
        "base image `{name}` in pool `{}` on {} has sha256 {found}, but config key \
         `images.{key}.sha256` is {expected}; overlays may use the base, so it is left alone: \
         give the new image another key, or delete the base by hand once no domain uses it",
        place.pool, place.host
    ))
}

/// The published base for image `key`, downloading it first when the pool
/// lacks it.
pub fn ensure(ctx: &CallContext, place: Place<'_>, key: &str, image: &Image) -> Result<Volume> {
    let name = base_name(&ctx.entry, key, image);
    if let Some(volume) = published(place, &name, key, image, false)? {
        remove_stale_temp(ctx, place, &name);
        return Ok(volume);
    }
    let lease = Lease::take(ctx, lease_key(place, &name), || busy(place, &name))?;
    // Another call may have published it while this one waited.
    let result = published(place, &name, key, image, true).and_then(|found| match found {
        Some(volume) => Ok(volume),
        None => download(place, &name, key, image),
    });
    lease.release();
    result
}

/// Removes a temporary volume whose removal failed after its base was
/// published, under the upload lease (an upload after someone deleted the
/// base by hand would be using it); best effort.
fn remove_stale_temp(ctx: &CallContext, place: Place<'_>, name: &str) {
    let temp = temp_name(name);
    if libvirt::get_volume(place.host, place.pool, &temp).is_err() {
        return;
    }
    let Ok(lease) = Lease::take(ctx, lease_key(place, name), || busy(place, name)) else { return };
    if let Err(error) = delete_volume(place, &temp) {
        log::debug!("left a temporary volume", volume = temp, error = error);
    }
    lease.release();
}

/// The base under its final name, checked against the config; `None` when
/// the pool has none ready. Holding the upload lease, a base whose copy
/// never completed is removed: whoever was copying it is gone.
fn published(
    place: Place<'_>,
    name: &str,
    key: &str,
    image: &Image,
    leased: bool,
) -> Result<Option<Volume>> {
    let volume = match libvirt::get_volume(place.host, place.pool, name) {
        Ok(volume) => volume,
        Err(LibvirtError::NotFound(_)) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    match record(place, name)? {
        Some(record) if !record.published => {
            if leased {
                log::warn!("removing a base whose copy was cut off", volume = name);
                delete_volume(place, name)?;
            }
            Ok(None)
        }
        Some(record) if record.sha256.eq_ignore_ascii_case(&image.sha256) => Ok(Some(volume)),
        Some(record) => Err(mismatch(place, name, key, &record.sha256, &image.sha256)),
        None => Err(ProviderError::Permanent(format!(
            "base image `{name}` in pool `{}` on {} was not published by this entry (no digest \
             on record), so it cannot be checked against config key `images.{key}.sha256`; \
             delete it by hand if no domain uses it, or give the image another key",
            place.pool, place.host
        ))),
    }
}

/// Downloads, verifies and publishes the base. Whatever fails, no volume
/// is left under the temporary name.
fn temp_name(base: &str) -> String {
    format!("{base}.part")
}

fn download(place: Place<'_>, name: &str, key: &str, image: &Image) -> Result<Volume> {
    let temp = temp_name(name);
    // A crashed upload's leftovers: its lease has expired, or ours would
    // not have been granted.
    delete_volume(place, &temp)?;
    log::info!("downloading base image", image = key, host = place.host, pool = place.pool);
    let mut body = Request::get(&image.url).send_streaming()?;
    if body.status() != 200 {
        let location = body.header("location").map(|to| format!(" (to {to})")).unwrap_or_default();
        return Err(ProviderError::Permanent(format!(
            "config key `images.{key}.url`: the server answered HTTP {}{location}, not the image; \
             redirects are not followed, so give the image's final URL",
            body.status()
        )));
    }
    let Some(length) = body.content_length() else {
        return Err(ProviderError::Permanent(format!(
            "config key `images.{key}.url`: the server did not say how long the image is \
             (no Content-Length); serve it from a server that does"
        )));
    };
    libvirt::create_volume(
        place.host,
        place.pool,
        &xml::volume(&temp, length.max(1), image.format.as_str(), None),
    )?;
    let streamed = stream_into(place, &temp, length, &mut body, key, image);
    let published = streamed.and_then(|()| {
        // Recorded first, so that a copy cut off is known for what it is.
        write_record(place, name, &image.sha256, false)?;
        let xml = xml::volume(name, length.max(1), image.format.as_str(), None);
        let volume = libvirt::clone_volume(place.host, place.pool, &xml, &temp)?;
        write_record(place, name, &image.sha256, true)?;
        Ok(volume)
    });
    let cleaned = delete_volume(place, &temp);
    let volume = published?;
    if let Err(error) = cleaned {
        // The base is published; the next create with it removes this.
        log::warn!("could not remove a temporary volume", volume = temp, error = error);
    }
    log::info!("base image published", image = key, host = place.host, volume = name);
    Ok(volume)
}

/// Streams the body into volume `temp`, hashing it; an error when the
/// body breaks off, runs long, or hashes to another digest than the
/// config's. The upload is aborted unless it completes.
fn stream_into(
    place: Place<'_>,
    temp: &str,
    length: u64,
    body: &mut proxyfleet_sdk::http::BodyStream,
    key: &str,
    image: &Image,
) -> Result<()> {
    let upload = libvirt::begin_upload(place.host, place.pool, temp, length)?;
    let mut hasher = Sha256::new();
    let mut received: u64 = 0;
    while let Some(chunk) = body.next_chunk()? {
        received += chunk.len() as u64;
        if received > length {
            return Err(ProviderError::Transient(format!(
                "config key `images.{key}.url`: the server sent more than the {length} bytes it \
                 announced"
            )));
        }
        hasher.update(&chunk);
        upload.write(&chunk)?;
    }
    if received < length {
        return Err(ProviderError::Transient(format!(
            "config key `images.{key}.url`: the download ended after {received} of {length} bytes"
        )));
    }
    let digest = hex(&hasher.finalize());
    if !digest.eq_ignore_ascii_case(&image.sha256) {
        return Err(ProviderError::Permanent(format!(
            "config key `images.{key}`: the image downloaded has sha256 {digest}, but \
             `images.{key}.sha256` is {}; nothing was published",
            image.sha256
        )));
    }
    libvirt::Upload::finish(upload)?;
    Ok(())
}

fn write_record(place: Place<'_>, name: &str, sha256: &str, published: bool) -> Result<()> {
    let key = record_key(place, name);
    let value = serde_json::to_vec(&Record { sha256: sha256.to_ascii_lowercase(), published })
        .map_err(|err| ProviderError::Permanent(format!("encoding a base record: {err}")))?;
    loop {
        let current = kv::get(&key)?;
        match kv::compare_and_swap(&key, current.map(|entry| entry.version), Some(&value))? {
            CasOutcome::Applied(_) => return Ok(()),
            // Someone wrote in between; write over it with what was verified.
            CasOutcome::Conflict(_) => {}
        }
    }
}

/// Deletes a volume of ours; gone already counts. An aborted upload holds
/// its volume for a moment after the abort, so "in use" is waited out.
pub fn delete_volume(place: Place<'_>, name: &str) -> Result<()> {
    let mut attempts = 0;
    loop {
        match libvirt::delete_volume(place.host, place.pool, name) {
            Ok(()) | Err(LibvirtError::NotFound(_)) => return Ok(()),
            Err(LibvirtError::InvalidState(message)) if attempts < 50 => {
                attempts += 1;
                if attempts == 1 {
                    log::debug!("volume busy, waiting", volume = name, reason = message);
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            // Still busy: something on the host works on it (a copy that
            // outlived the call that started it). Later, not never.
            Err(LibvirtError::InvalidState(message)) => {
                return Err(ProviderError::Transient(format!(
                    "volume `{name}` in pool `{}` on {} is still in use ({message}); a copy into \
                     it may still be running on the host: if this repeats, raise the grant's \
                     callTimeout above the time a base image takes to copy",
                    place.pool, place.host
                )));
            }
            Err(error) => return Err(error.into()),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn busy(place: Place<'_>, name: &str) -> ProviderError {
    ProviderError::Transient(format!(
        "base image `{name}` is being uploaded to pool `{}` on {} by another call",
        place.pool, place.host
    ))
}
