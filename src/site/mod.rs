//! `bcd site`: the boot server of a site (issue 10). For now only what the
//! ramdisk's image needs from it: the configuration archive appended to the
//! initrd it serves (`cpio`).

pub mod cpio;
