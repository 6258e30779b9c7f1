package filelock

import "syscall"

// fsType names dir's file system, and says whether it is a network one,
// from statfs's magic number ("" for one this table does not know).
func fsType(dir string) (name string, network bool) {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return "", false
	}
	switch uint32(st.Type) {
	case 0x6969:
		return "NFS", true
	case 0x517B, 0xFE534D42, 0xFF534D42:
		return "SMB/CIFS", true
	case 0x65735546:
		return "FUSE (sshfs, a cloud mount, ...)", true
	case 0x00C36400:
		return "CephFS", true
	case 0x01021997:
		return "9P", true
	case 0xEF53:
		return "ext4", false
	case 0x58465342:
		return "XFS", false
	case 0x9123683E:
		return "Btrfs", false
	case 0x01021994:
		return "tmpfs", false
	case 0x794C7630:
		return "overlayfs", false
	case 0x2FC12FC1:
		return "ZFS", false
	}
	return "", false
}
