//! Listing a bucket in S3's order: keys by their bytes, as if the tree
//! were flat. A directory `d` holds the keys that start with `d/`, so the
//! entries of one directory are walked sorted by name, a directory's name
//! compared with `/` appended; directories wholly outside the prefix or
//! wholly before the marker are not read, and with delimiter `/` a
//! directory past the prefix is one common prefix, not read either.

use crate::paths::is_internal;
use crate::Gateway;
use nasd_fs::{FileAttr, FileKind, FsClient, Ino};
use nasd_vfs::FIRST_ENTRY;
use s3s::S3Result;

/// What a listing found.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Keys, their attributes and ETags (`None`: the file has no stored
    /// ETag, as one made by another gateway), in order.
    pub objects: Vec<(String, FileAttr, Option<String>)>,
    /// Common prefixes, in order.
    pub prefixes: Vec<String>,
    /// More follow the last one returned.
    pub truncated: bool,
}

impl Listing {
    /// The last key or common prefix returned (the next page starts after it).
    pub fn last(&self) -> Option<&str> {
        let key = self.objects.last().map(|(k, _, _)| k.as_str());
        let prefix = self.prefixes.last().map(String::as_str);
        key.max(prefix)
    }
}

/// What to list.
pub(crate) struct Query<'a> {
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    /// Only what sorts after this (start-after, marker, continuation).
    pub after: &'a str,
    pub max: usize,
}

struct Child {
    name: String,
    kind: FileKind,
    entry: nasd_fs::Entry,
}

struct Frame {
    /// Key prefix of the directory's entries ("" or "a/b/").
    base: String,
    children: Vec<Child>,
    next: usize,
}

impl Gateway {
    /// Lists bucket directory `bucket` (held) for `q`.
    pub(crate) async fn list(&self, cx: &FsClient, bucket: Ino, q: &Query<'_>) -> S3Result<Listing> {
        let mut out = Listing::default();
        let mut objects = Vec::new();
        if q.max == 0 {
            return Ok(out);
        }
        let mut stack = vec![Frame { base: String::new(), children: self.children(cx, bucket).await?, next: 0 }];
        while let Some(frame) = stack.last_mut() {
            let Some(child) = frame.children.get(frame.next) else {
                stack.pop();
                continue;
            };
            let (key, kind, entry) = (format!("{}{}", frame.base, child.name), child.kind, child.entry.clone());
            frame.next += 1;
            let found = match kind {
                FileKind::Dir => {
                    let dir_key = key + "/";
                    if !(dir_key.starts_with(q.prefix) || q.prefix.starts_with(&dir_key)) {
                        continue;
                    }
                    if dir_key.as_str() < q.after && !q.after.starts_with(&dir_key) {
                        continue;
                    }
                    if let Some(prefix) = rolled_up(&dir_key, q) {
                        Found::Prefix(prefix)
                    } else {
                        let attr = self.vfs.remember_listed(&entry).await;
                        let children = self.children(cx, attr.ino).await;
                        self.vfs.forget(attr.ino, 1);
                        stack.push(Frame { base: dir_key, children: children?, next: 0 });
                        continue;
                    }
                }
                FileKind::File => {
                    if !key.starts_with(q.prefix) || key.as_str() <= q.after {
                        continue;
                    }
                    match rolled_up(&key, q) {
                        Some(prefix) => Found::Prefix(prefix),
                        None => Found::Object(key, entry),
                    }
                }
                _ => continue,
            };
            if let Found::Prefix(p) = &found {
                let seen = out.prefixes.last() == Some(p);
                if seen || p.as_str() <= q.after || q.after.starts_with(p.as_str()) {
                    continue;
                }
            }
            if objects.len() + out.prefixes.len() == q.max {
                out.truncated = true;
                break;
            }
            match found {
                Found::Prefix(p) => out.prefixes.push(p),
                Found::Object(k, e) => objects.push((k, e)),
            }
        }
        out.objects = self.with_etags(cx, objects).await?;
        Ok(out)
    }

    /// Each listed object with its stored ETag, [`ETAG_LOOKUPS_IN_FLIGHT`]
    /// asked at a time (S3 clients compare it with their own MD5s).
    async fn with_etags(
        &self,
        cx: &FsClient,
        objects: Vec<(String, nasd_fs::Entry)>,
    ) -> S3Result<Vec<(String, FileAttr, Option<String>)>> {
        use futures::StreamExt;
        futures::stream::iter(objects)
            .map(|(key, entry)| async move {
                let attr = self.vfs.remember_listed(&entry).await;
                let meta = self.meta(cx, attr.ino).await;
                self.vfs.forget(attr.ino, 1);
                Ok((key, attr, meta?.map(|m| m.etag)))
            })
            .buffered(ETAG_LOOKUPS_IN_FLIGHT)
            .collect::<Vec<S3Result<_>>>()
            .await
            .into_iter()
            .collect()
    }

    /// The entries of directory `ino` (held) that can be keys, sorted as
    /// S3 orders the keys below them.
    async fn children(&self, cx: &FsClient, ino: Ino) -> S3Result<Vec<Child>> {
        let fh = self.vfs.opendir(ino).map_err(crate::ops::s3_err)?;
        let mut items = Vec::new();
        let r = self
            .vfs
            .readdir(cx, fh, FIRST_ENTRY, |_, item| {
                items.push(item.clone());
                false
            })
            .await;
        self.vfs.releasedir(fh);
        r.map_err(crate::ops::s3_err)?;
        let mut children: Vec<Child> = items
            .into_iter()
            .filter(|i| !is_internal(&i.name) && matches!(i.kind, FileKind::File | FileKind::Dir))
            .filter_map(|i| Some(Child { name: i.name, kind: i.kind, entry: i.entry? }))
            .collect();
        children.sort_by_key(sort_name);
        Ok(children)
    }
}

enum Found {
    Prefix(String),
    Object(String, nasd_fs::Entry),
}

/// Stored ETags a listing asks for at once.
const ETAG_LOOKUPS_IN_FLIGHT: usize = 16;

fn sort_name(c: &Child) -> Vec<u8> {
    let mut n = c.name.as_bytes().to_vec();
    if c.kind == FileKind::Dir {
        n.push(b'/');
    }
    n
}

/// The common prefix `key` rolls up into under `q`'s delimiter, if any.
fn rolled_up(key: &str, q: &Query<'_>) -> Option<String> {
    let delimiter = q.delimiter.filter(|d| !d.is_empty())?;
    let rest = key.strip_prefix(q.prefix)?;
    let at = rest.find(delimiter)?;
    Some(format!("{}{}", q.prefix, &rest[..at + delimiter.len()]))
}

/// `s` percent-encoded as S3's `encoding-type=url` asks (all but
/// unreserved characters and `/`).
pub(crate) fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_rolls_up_at_the_first_delimiter_after_the_prefix() {
        let q = Query { prefix: "a/", delimiter: Some("/"), after: "", max: 10 };
        assert_eq!(rolled_up("a/b/c", &q).as_deref(), Some("a/b/"));
        assert_eq!(rolled_up("a/b", &q), None);
        let q = Query { prefix: "", delimiter: Some("-"), after: "", max: 10 };
        assert_eq!(rolled_up("x-y/z", &q).as_deref(), Some("x-"));
    }

    #[test]
    fn url_encoding_keeps_slashes_and_unreserved() {
        assert_eq!(url_encode("a b/c+d%é"), "a%20b/c%2Bd%25%C3%A9");
    }
}
