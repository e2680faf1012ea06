//! This process's control groups, read from `/proc/self/cgroup` and `/proc/self/mountinfo`:
//! where its group is in each mounted hierarchy (cgroup v2, and v1 per controller), and the
//! memory limit it runs under.

use std::fs;
use std::path::PathBuf;

/// A cgroup file system mounted here: its mount point, the hierarchy path mounted there, and
/// (v1) its controllers.
#[derive(Debug, Clone, PartialEq)]
struct Mount {
    point: PathBuf,
    root: String,
    v2: bool,
    controllers: Vec<String>,
}

/// This process's groups, as far as they are mounted here.
#[derive(Debug, Clone, Default)]
pub struct OwnGroups {
    /// `/proc/self/cgroup`'s lines: (controllers, path); v2's has no controllers.
    memberships: Vec<(Vec<String>, String)>,
    mounts: Vec<Mount>,
}

impl OwnGroups {
    /// Reads them now.
    pub fn read() -> Result<Self, String> {
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
        Ok(Self::parse(&own, &mounts))
    }

    fn parse(own: &str, mountinfo: &str) -> Self {
        let memberships = own
            .lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                let controllers = controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect();
                Some((controllers, path.to_string()))
            })
            .collect();
        Self {
            memberships,
            mounts: parse_mounts(mountinfo),
        }
    }

    /// The directory of this process's group in the unified (v2) hierarchy, if mounted.
    pub fn v2_dir(&self) -> Option<PathBuf> {
        let path = self
            .memberships
            .iter()
            .find(|(controllers, _)| controllers.is_empty())
            .map(|(_, path)| path)?;
        self.mounts
            .iter()
            .filter(|m| m.v2)
            .find_map(|m| own_dir(m, path))
    }

    /// The directory of this process's group in the v1 hierarchy of `controller`, if
    /// mounted.
    pub fn v1_dir(&self, controller: &str) -> Option<PathBuf> {
        let path = self
            .memberships
            .iter()
            .find(|(controllers, _)| controllers.iter().any(|c| c == controller))
            .map(|(_, path)| path)?;
        self.mounts
            .iter()
            .filter(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
            .find_map(|m| own_dir(m, path))
    }

    /// The memory limit of this process's group and what it uses now, bytes, where one is
    /// set (v2's `memory.max`, else v1's `memory.limit_in_bytes`).
    pub fn memory_limit(&self) -> Option<MemoryLimit> {
        let read = |dir: &PathBuf, file: &str| -> Option<u64> {
            fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
        };
        if let Some(dir) = self.v2_dir() {
            if let (Some(limit), Some(usage)) =
                (read(&dir, "memory.max"), read(&dir, "memory.current"))
            {
                return Some(MemoryLimit { limit, usage });
            }
        }
        let dir = self.v1_dir("memory")?;
        let limit = read(&dir, "memory.limit_in_bytes")?;
        // v1 writes "no limit" as a huge page-aligned number.
        (limit < 1 << 60).then(|| MemoryLimit {
            limit,
            usage: read(&dir, "memory.usage_in_bytes").unwrap_or(0),
        })
    }
}

/// A group's memory limit and its use, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The limit.
    pub limit: u64,
    /// In use now (page cache included).
    pub usage: u64,
}

fn parse_mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let (root, point) = (*left.get(3)?, *left.get(4)?);
            let fstype = *right.first()?;
            let options = right.get(2).copied().unwrap_or_default();
            (fstype == "cgroup" || fstype == "cgroup2").then(|| Mount {
                point: PathBuf::from(point),
                root: root.to_string(),
                v2: fstype == "cgroup2",
                controllers: options.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// This process's group in `mount` (`/proc/self/cgroup`'s path under the mounted root).
fn own_dir(mount: &Mount, path: &str) -> Option<PathBuf> {
    let rest = path.strip_prefix(mount.root.trim_end_matches('/'))?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let dir = mount.point.join(rest.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn mountinfo_lines_name_cgroup_mounts_and_their_controllers() {
        let info = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                    35 31 0:32 /docker/x /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                    32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        let m = parse_mounts(info);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].point, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(m[0].root, "/docker/x");
        assert!(!m[0].v2 && m[0].controllers.contains(&"memory".to_string()));
        assert!(m[1].controllers.contains(&"cpu".to_string()));
        assert!(m[2].v2);
    }

    #[test]
    fn the_own_group_is_found_under_the_mounted_root() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("job/7")).unwrap();
        let mount = Mount {
            point: tmp.path().to_path_buf(),
            root: "/docker/x".into(),
            v2: true,
            controllers: vec![],
        };
        assert_eq!(
            own_dir(&mount, "/docker/x/job/7"),
            Some(tmp.path().join("job/7"))
        );
        assert_eq!(own_dir(&mount, "/elsewhere"), None);
        assert_eq!(own_dir(&mount, "/docker/xyz"), None);
        let at_root = Mount {
            root: "/".into(),
            ..mount
        };
        assert_eq!(own_dir(&at_root, "/"), Some(tmp.path().to_path_buf()));
    }

    #[test]
    fn memberships_name_v1_controllers_and_the_unified_group() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("mem/job")).unwrap();
        std::fs::create_dir_all(tmp.path().join("uni/svc")).unwrap();
        let info = format!(
            "35 31 0:32 / {0}/mem rw - cgroup cgroup rw,memory\n\
             41 31 0:38 / {0}/uni rw - cgroup2 cgroup2 rw",
            tmp.path().display()
        );
        let g = OwnGroups::parse("4:memory:/job\n8:pids:/\n0::/svc", &info);
        assert_eq!(g.v1_dir("memory"), Some(tmp.path().join("mem/job")));
        assert_eq!(g.v1_dir("pids"), None);
        assert_eq!(g.v2_dir(), Some(tmp.path().join("uni/svc")));
    }
}
