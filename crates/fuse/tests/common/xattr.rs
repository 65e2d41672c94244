//! Extended-attribute system calls on paths, as programs make them (libc),
//! each failure as its errno.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `p` as a NUL-terminated string.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// The value of `name`, read into a buffer of `size` bytes.
pub fn getxattr(p: &Path, name: &str, size: usize) -> Result<Vec<u8>, i32> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// The names `p` lists (panics if the call fails).
pub fn listxattr(p: &Path) -> Vec<String> {
    let p = cpath(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: a valid NUL-terminated path and a buffer of the length given.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "listxattr: {}", std::io::Error::last_os_error());
    buf.truncate(r as usize);
    buf.split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into_owned()).collect()
}
