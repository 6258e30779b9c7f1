package filelock

import "syscall"

// fsType names dir's file system, and says whether it is a network one,
// from statfs's magic number ("" for one this table does not know).
func fsType(dir string) (name string, network bool) {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return "", false
	}
	fs := map[uint32]struct {
		name    string
		network bool
	}{
		0x6969:     {"NFS", true},
		0x517B:     {"SMB/CIFS", true},
		0xFE534D42: {"SMB/CIFS", true},
		0xFF534D42: {"SMB/CIFS", true},
		0x65735546: {"FUSE (sshfs, a cloud mount, ...)", true},
		0x00C36400: {"CephFS", true},
		0x01021997: {"9P", true},
		0xEF53:     {"ext4", false},
		0x58465342: {"XFS", false},
		0x9123683E: {"Btrfs", false},
		0x01021994: {"tmpfs", false},
		0x794C7630: {"overlayfs", false},
		0x2FC12FC1: {"ZFS", false},
	}[uint32(st.Type)]
	return fs.name, fs.network
}
