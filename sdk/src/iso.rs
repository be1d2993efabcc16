//! ISO 9660 images with Joliet names, for cloud-init's NoCloud seed.
//!
//! cloud-init's NoCloud datasource finds a filesystem labelled `cidata` and
//! reads `user-data`, `meta-data` and (optionally) `network-config` from
//! its root. Plain ISO 9660 names cannot spell those (`USER_DAT.;1`), so
//! the image carries a Joliet directory with the real names next to the
//! primary one; Linux and cloud-init read the Joliet names.
//!
//! The output is deterministic: the same files give the same bytes (fixed
//! timestamps, files sorted by name), so a re-upload can be compared and
//! tests can pin images. Only a flat root directory is supported, which is
//! all a seed needs.
//!
//! ```
//! let image = proxyfleet_sdk::iso::nocloud_seed(
//!     b"#cloud-config\n",
//!     b"instance-id: pf-1\nlocal-hostname: pf-1\n",
//!     Some(b"version: 2\n"),
//! )
//! .expect("a seed fits");
//! assert_eq!(image.len() % 2048, 0);
//! ```

use std::collections::BTreeMap;

const SECTOR: usize = 2048;
/// Sectors 0 to 15 are the system area.
const FIRST_DESCRIPTOR: usize = 16;
/// Longest Joliet name in characters.
const JOLIET_NAME_MAX: usize = 64;
/// Every timestamp in the image: 2000-01-01 00:00:00 UTC, fixed so that the
/// output does not depend on when it was built.
const RECORD_DATE: [u8; 7] = [100, 1, 1, 0, 0, 0, 0];
const VOLUME_DATE: &[u8; 16] = b"2000010100000000";

/// Volume label cloud-init's NoCloud datasource looks for.
///
/// ```
/// use proxyfleet_sdk::iso::{IsoBuilder, NOCLOUD_LABEL};
///
/// let image = IsoBuilder::new(NOCLOUD_LABEL)?
///     .file("user-data", "#cloud-config\n")?
///     .file("meta-data", "instance-id: pf-1\n")?
///     .build()?;
/// assert_eq!(image.len() % 2048, 0);
/// # Ok::<(), proxyfleet_sdk::iso::IsoError>(())
/// ```
pub const NOCLOUD_LABEL: &str = "cidata";

/// Why an image cannot be built.
///
/// It converts into [`crate::ProviderError::InvalidSpec`] with `?`.
///
/// ```
/// use proxyfleet_sdk::ProviderError;
/// use proxyfleet_sdk::iso::{IsoBuilder, IsoError};
///
/// let error = IsoBuilder::new("cidata").and_then(|iso| iso.file("user data", "x"));
/// assert_eq!(error.expect_err("a space"), IsoError::InvalidName("user data".into()));
/// assert!(matches!(ProviderError::from(IsoError::TooLarge), ProviderError::InvalidSpec(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IsoError {
    /// A file name is empty, too long, or has characters other than ASCII
    /// letters, digits, `.`, `_` and `-`.
    #[error("ISO file name `{0}` is invalid: use 1 to 64 of A-Z a-z 0-9 . _ -")]
    InvalidName(String),
    /// The volume label is empty, longer than 16 characters, or not ASCII
    /// letters, digits and `_`.
    #[error("ISO volume label `{0}` is invalid: use 1 to 16 of A-Z a-z 0-9 _")]
    InvalidLabel(String),
    /// The root directory holds more entries than one sector fits.
    #[error("too many files for one ISO directory sector ({0})")]
    TooManyFiles(usize),
    /// The image would exceed the 32-bit sizes ISO 9660 records.
    #[error("ISO image too large")]
    TooLarge,
}

impl From<IsoError> for crate::ProviderError {
    fn from(error: IsoError) -> Self {
        crate::ProviderError::InvalidSpec(error.to_string())
    }
}

/// Builds an image from files in its root directory.
///
/// ```
/// use proxyfleet_sdk::iso::IsoBuilder;
///
/// let image = IsoBuilder::new("config_2")?
///     .file("meta_data.json", r#"{"uuid":"pf-1"}"#)?
///     .file("user_data", "#cloud-config\n")?
///     .build()?;
/// // The same files give the same bytes.
/// let again = IsoBuilder::new("config_2")?
///     .file("user_data", "#cloud-config\n")?
///     .file("meta_data.json", r#"{"uuid":"pf-1"}"#)?
///     .build()?;
/// assert_eq!(image, again);
/// # Ok::<(), proxyfleet_sdk::iso::IsoError>(())
/// ```
#[derive(Debug, Clone)]
pub struct IsoBuilder {
    label: String,
    files: BTreeMap<String, Vec<u8>>,
}

impl IsoBuilder {
    /// An empty image labelled `label` (e.g. [`NOCLOUD_LABEL`]).
    ///
    /// ```
    /// use proxyfleet_sdk::iso::{IsoBuilder, IsoError};
    ///
    /// assert!(IsoBuilder::new("cidata").is_ok());
    /// assert_eq!(
    ///     IsoBuilder::new("cloud-init seed").expect_err("spaces and dashes"),
    ///     IsoError::InvalidLabel("cloud-init seed".into())
    /// );
    /// ```
    pub fn new(label: &str) -> Result<Self, IsoError> {
        let valid = !label.is_empty()
            && label.len() <= 16
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(IsoError::InvalidLabel(label.to_owned()));
        }
        Ok(Self { label: label.to_owned(), files: BTreeMap::new() })
    }

    /// Adds (or replaces) the root file `name`.
    ///
    /// ```
    /// use proxyfleet_sdk::iso::IsoBuilder;
    ///
    /// let once = IsoBuilder::new("cidata")?.file("meta-data", "instance-id: pf-2\n")?;
    /// let replaced = IsoBuilder::new("cidata")?
    ///     .file("meta-data", "instance-id: pf-1\n")?
    ///     .file("meta-data", "instance-id: pf-2\n")?;
    /// assert_eq!(once.build()?, replaced.build()?);
    /// # Ok::<(), proxyfleet_sdk::iso::IsoError>(())
    /// ```
    pub fn file(mut self, name: &str, content: impl Into<Vec<u8>>) -> Result<Self, IsoError> {
        let valid = !name.is_empty()
            && name.len() <= JOLIET_NAME_MAX
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && name != "."
            && name != "..";
        if !valid {
            return Err(IsoError::InvalidName(name.to_owned()));
        }
        self.files.insert(name.to_owned(), content.into());
        Ok(self)
    }

    /// The image bytes, a whole number of 2048-byte sectors.
    ///
    /// ```
    /// use proxyfleet_sdk::iso::IsoBuilder;
    ///
    /// let image = IsoBuilder::new("cidata")?.file("user-data", vec![0u8; 5000])?.build()?;
    /// assert_eq!(image.len() % 2048, 0);
    /// // The primary volume descriptor sits in sector 16.
    /// assert_eq!(&image[16 * 2048 + 1..][..5], b"CD001");
    /// # Ok::<(), proxyfleet_sdk::iso::IsoError>(())
    /// ```
    pub fn build(&self) -> Result<Vec<u8>, IsoError> {
        // Layout: descriptors (primary, Joliet, terminator), four path
        // tables (L and M for each tree), the two root directories, then the
        // files in name order, each from a sector boundary.
        let primary_descriptor = FIRST_DESCRIPTOR;
        let joliet_descriptor = primary_descriptor + 1;
        let terminator = joliet_descriptor + 1;
        let path_tables = terminator + 1; // four sectors
        let primary_root = path_tables + 4;
        let joliet_root = primary_root + 1;
        let mut next_sector = joliet_root + 1;

        let mut extents = Vec::with_capacity(self.files.len());
        for content in self.files.values() {
            extents.push(next_sector);
            next_sector += content.len().div_ceil(SECTOR);
        }
        let total_sectors = u32::try_from(next_sector).map_err(|_| IsoError::TooLarge)?;

        let primary_names = primary_names(self.files.keys());
        let primary_entries: Vec<(Vec<u8>, usize, usize)> = self
            .files
            .values()
            .zip(&extents)
            .zip(&primary_names)
            .map(|((content, extent), name)| (name.clone(), *extent, content.len()))
            .collect();
        let mut joliet_entries: Vec<(Vec<u8>, usize, usize)> = self
            .files
            .iter()
            .zip(&extents)
            .map(|((name, content), extent)| (ucs2(name), *extent, content.len()))
            .collect();
        // Directory records are sorted by their identifier bytes.
        let mut primary_entries = primary_entries;
        primary_entries.sort_by(|a, b| a.0.cmp(&b.0));
        joliet_entries.sort_by(|a, b| a.0.cmp(&b.0));

        let mut image = vec![0u8; next_sector * SECTOR];
        let primary_dir = directory(primary_root, &primary_entries)?;
        let joliet_dir = directory(joliet_root, &joliet_entries)?;
        image[primary_root * SECTOR..][..SECTOR].copy_from_slice(&primary_dir);
        image[joliet_root * SECTOR..][..SECTOR].copy_from_slice(&joliet_dir);

        let path_table_size = write_path_tables(&mut image, path_tables, primary_root, joliet_root);
        let primary = Descriptor {
            kind: 1,
            label: self.label.as_bytes().to_vec(),
            joliet: false,
            total_sectors,
            path_table_size,
            path_table_l: path_tables,
            path_table_m: path_tables + 1,
            root: primary_root,
        };
        let joliet = Descriptor {
            kind: 2,
            label: ucs2(&self.label),
            joliet: true,
            total_sectors,
            path_table_size,
            path_table_l: path_tables + 2,
            path_table_m: path_tables + 3,
            root: joliet_root,
        };
        image[primary_descriptor * SECTOR..][..SECTOR].copy_from_slice(&primary.encode());
        image[joliet_descriptor * SECTOR..][..SECTOR].copy_from_slice(&joliet.encode());
        let end = &mut image[terminator * SECTOR..][..7];
        end.copy_from_slice(&[255, b'C', b'D', b'0', b'0', b'1', 1]);

        for (content, extent) in self.files.values().zip(&extents) {
            image[extent * SECTOR..][..content.len()].copy_from_slice(content);
        }
        Ok(image)
    }
}

/// A NoCloud seed: label `cidata`, files `user-data`, `meta-data` and, when
/// given, `network-config`.
///
/// ```
/// let image = proxyfleet_sdk::iso::nocloud_seed(
///     b"#cloud-config\npackages: [tinyproxy]\n",
///     b"instance-id: pf-1\nlocal-hostname: pf-1\n",
///     None,
/// )?;
/// assert_eq!(image.len() % 2048, 0);
/// # Ok::<(), proxyfleet_sdk::iso::IsoError>(())
/// ```
pub fn nocloud_seed(
    user_data: &[u8],
    meta_data: &[u8],
    network_config: Option<&[u8]>,
) -> Result<Vec<u8>, IsoError> {
    let mut builder = IsoBuilder::new(NOCLOUD_LABEL)?
        .file("user-data", user_data)?
        .file("meta-data", meta_data)?;
    if let Some(network_config) = network_config {
        builder = builder.file("network-config", network_config)?;
    }
    builder.build()
}

/// ISO 9660 level 1 names (`USER_DAT.;1`) for the primary tree, unique
/// within the directory; readers that ignore Joliet see these.
fn primary_names<'a>(names: impl Iterator<Item = &'a String>) -> Vec<Vec<u8>> {
    let mut taken = std::collections::BTreeSet::new();
    names
        .map(|name| {
            let (stem, extension) = match name.rsplit_once('.') {
                Some((stem, extension)) if !stem.is_empty() => (stem, extension),
                _ => (name.as_str(), ""),
            };
            let clean = |text: &str, max: usize| -> String {
                text.chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
                    .take(max)
                    .collect()
            };
            let (mut stem, extension) = (clean(stem, 8), clean(extension, 3));
            let mut counter = 0u32;
            let base = stem.clone();
            while !taken.insert(format!("{stem}.{extension}")) {
                counter += 1;
                let suffix = counter.to_string();
                stem = format!("{}{suffix}", &base[..base.len().min(8 - suffix.len())]);
            }
            format!("{stem}.{extension};1").into_bytes()
        })
        .collect()
}

fn ucs2(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

fn both_u32(value: usize) -> [u8; 8] {
    let value = u32::try_from(value).unwrap_or(u32::MAX);
    let mut out = [0; 8];
    out[..4].copy_from_slice(&value.to_le_bytes());
    out[4..].copy_from_slice(&value.to_be_bytes());
    out
}

fn both_u16(value: u16) -> [u8; 4] {
    let mut out = [0; 4];
    out[..2].copy_from_slice(&value.to_le_bytes());
    out[2..].copy_from_slice(&value.to_be_bytes());
    out
}

/// One directory record.
fn record(identifier: &[u8], extent: usize, length: usize, is_directory: bool) -> Vec<u8> {
    let mut out = vec![0u8; 33];
    out[2..10].copy_from_slice(&both_u32(extent));
    out[10..18].copy_from_slice(&both_u32(length));
    out[18..25].copy_from_slice(&RECORD_DATE);
    out[25] = if is_directory { 2 } else { 0 };
    out[28..32].copy_from_slice(&both_u16(1));
    out[32] = u8::try_from(identifier.len()).unwrap_or(u8::MAX);
    out.extend_from_slice(identifier);
    if out.len() % 2 == 1 {
        out.push(0);
    }
    out[0] = u8::try_from(out.len()).unwrap_or(u8::MAX);
    out
}

/// A root directory sector: `.`, `..` and the files.
fn directory(sector: usize, entries: &[(Vec<u8>, usize, usize)]) -> Result<Vec<u8>, IsoError> {
    let mut out = record(&[0], sector, SECTOR, true);
    out.extend(record(&[1], sector, SECTOR, true));
    for (identifier, extent, length) in entries {
        out.extend(record(identifier, *extent, *length, false));
    }
    if out.len() > SECTOR {
        return Err(IsoError::TooManyFiles(entries.len()));
    }
    out.resize(SECTOR, 0);
    Ok(out)
}

/// Writes the L and M path tables of both trees (each only the root) and
/// returns their size in bytes.
fn write_path_tables(
    image: &mut [u8],
    first: usize,
    primary_root: usize,
    joliet_root: usize,
) -> usize {
    let entry = |root: usize, big_endian: bool| {
        let root = u32::try_from(root).unwrap_or(u32::MAX);
        let mut out = vec![1u8, 0];
        out.extend(if big_endian { root.to_be_bytes() } else { root.to_le_bytes() });
        out.extend(if big_endian { 1u16.to_be_bytes() } else { 1u16.to_le_bytes() });
        // The root's identifier is a single zero byte, padded to even.
        out.extend([0, 0]);
        out
    };
    let tables = [
        entry(primary_root, false),
        entry(primary_root, true),
        entry(joliet_root, false),
        entry(joliet_root, true),
    ];
    for (index, table) in tables.iter().enumerate() {
        image[(first + index) * SECTOR..][..table.len()].copy_from_slice(table);
    }
    // The recorded size excludes the padding byte.
    tables[0].len() - 1
}

/// A primary (type 1) or Joliet supplementary (type 2) volume descriptor.
struct Descriptor {
    kind: u8,
    label: Vec<u8>,
    joliet: bool,
    total_sectors: u32,
    path_table_size: usize,
    path_table_l: usize,
    path_table_m: usize,
    root: usize,
}

impl Descriptor {
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; SECTOR];
        out[0] = self.kind;
        out[1..6].copy_from_slice(b"CD001");
        out[6] = 1;
        // Text fields are space-padded: in UCS-2 for Joliet.
        let pad = |field: &mut [u8], text: &[u8], joliet: bool| {
            let space: &[u8] = if joliet { &[0, b' '] } else { b" " };
            for chunk in field.chunks_mut(space.len()) {
                if chunk.len() == space.len() {
                    chunk.copy_from_slice(space);
                }
            }
            field[..text.len()].copy_from_slice(text);
        };
        pad(&mut out[8..40], &[], self.joliet);
        pad(&mut out[40..72], &self.label, self.joliet);
        let total = usize::try_from(self.total_sectors).unwrap_or(usize::MAX);
        out[80..88].copy_from_slice(&both_u32(total));
        if self.joliet {
            // Escape sequence for UCS-2 level 3.
            out[88..91].copy_from_slice(b"%/E");
        }
        out[120..124].copy_from_slice(&both_u16(1));
        out[124..128].copy_from_slice(&both_u16(1));
        let sector = u16::try_from(SECTOR).unwrap_or(u16::MAX);
        out[128..132].copy_from_slice(&both_u16(sector));
        out[132..140].copy_from_slice(&both_u32(self.path_table_size));
        let l = u32::try_from(self.path_table_l).unwrap_or(u32::MAX);
        let m = u32::try_from(self.path_table_m).unwrap_or(u32::MAX);
        out[140..144].copy_from_slice(&l.to_le_bytes());
        out[148..152].copy_from_slice(&m.to_be_bytes());
        out[156..190].copy_from_slice(&record(&[0], self.root, SECTOR, true));
        for range in [190..318, 318..446, 446..574, 574..702] {
            pad(&mut out[range], &[], self.joliet);
        }
        for range in [702..739, 739..776, 776..813] {
            pad(&mut out[range], &[], self.joliet);
        }
        for start in [813, 830] {
            out[start..start + 16].copy_from_slice(VOLUME_DATE);
        }
        for start in [847, 864] {
            out[start..start + 16].copy_from_slice(b"0000000000000000");
        }
        out[881] = 1;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::process::Command;

    fn seed() -> Vec<u8> {
        nocloud_seed(
            b"#cloud-config\npackages: [squid]\n",
            b"instance-id: pf-123\nlocal-hostname: pf-123\n",
            Some(b"version: 2\nethernets: {}\n"),
        )
        .expect("seed builds")
    }

    #[test]
    fn output_is_deterministic_and_sector_aligned() {
        let (first, second) = (seed(), seed());
        assert_eq!(first, second);
        assert_eq!(first.len() % SECTOR, 0);
        assert_eq!(&first[16 * SECTOR + 1..16 * SECTOR + 6], b"CD001");
        assert_eq!(&first[16 * SECTOR + 40..16 * SECTOR + 46], b"cidata");
        assert_eq!(&first[17 * SECTOR + 88..17 * SECTOR + 91], b"%/E");
    }

    #[test]
    fn primary_names_are_level_one_and_unique() {
        let names = ["user-data", "user-datb", "meta-data", "a.b.tar"].map(str::to_owned);
        let encoded: Vec<String> = primary_names(names.iter())
            .into_iter()
            .map(|name| String::from_utf8(name).expect("ascii"))
            .collect();
        assert_eq!(encoded, ["USER_DAT.;1", "USER_DA1.;1", "META_DAT.;1", "A_B.TAR;1"]);
    }

    #[test]
    fn bad_names_and_labels_are_refused() {
        assert!(matches!(IsoBuilder::new("ci data"), Err(IsoError::InvalidLabel(_))));
        assert!(matches!(IsoBuilder::new(""), Err(IsoError::InvalidLabel(_))));
        let builder = IsoBuilder::new("cidata").expect("valid label");
        for bad in ["", "a/b", "..", &"x".repeat(65)] {
            assert!(
                matches!(builder.clone().file(bad, *b""), Err(IsoError::InvalidName(_))),
                "{bad}"
            );
        }
        let crowded = (0..60).try_fold(builder, |builder, i| builder.file(&format!("f{i}"), *b""));
        assert!(matches!(crowded.expect("names valid").build(), Err(IsoError::TooManyFiles(60))));
    }

    /// Reads the image back with `isoinfo` from Debian's `genisoimage`, an
    /// independent ISO 9660 implementation.
    #[test]
    fn isoinfo_reads_the_label_and_the_joliet_files() {
        let image = seed();
        let path: PathBuf =
            std::env::temp_dir().join(format!("proxyfleet-iso-test-{}.iso", std::process::id()));
        std::fs::write(&path, &image).expect("write the image");
        let run = |args: &[&str]| {
            let output = Command::new("isoinfo").args(args).arg("-i").arg(&path).output();
            let output = output.expect(
                "isoinfo is missing: install Debian's `genisoimage` package to run this test",
            );
            assert!(output.status.success(), "isoinfo {args:?}: {output:?}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let description = run(&["-d"]);
        assert!(description.contains("Volume id: cidata"), "{description}");
        assert!(description.contains("Joliet with UCS level 3 found"), "{description}");
        let listing = run(&["-J", "-f"]);
        let mut names: Vec<&str> = listing.lines().collect();
        names.sort_unstable();
        assert_eq!(names, ["/meta-data", "/network-config", "/user-data"]);
        assert_eq!(run(&["-J", "-x", "/user-data"]), "#cloud-config\npackages: [squid]\n");
        assert_eq!(run(&["-J", "-x", "/network-config"]), "version: 2\nethernets: {}\n");
        assert_eq!(
            run(&["-J", "-x", "/meta-data"]),
            "instance-id: pf-123\nlocal-hostname: pf-123\n"
        );
        let _ = std::fs::remove_file(&path);
    }
}
