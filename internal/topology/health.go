package topology

// WithHealth returns a copy of n with the parts health reports say are down
// taken out of its matrices, so that what reads the copy (paths, NVLink
// islands, NearestNIC) never counts on a broken part.
//
// downNVLinks maps a GPU's position (its row in GPUPaths) to how many of its
// NVLinks are down. A source that reports a link down says which GPU and
// which of its links, not where the link went, so the rule is conservative:
//
//   - an NV# pair loses the down links of both its ends: NV12 between a GPU
//     with one link down and a healthy one becomes NV11, between two GPUs
//     with one link down each NV10 (on an NVSwitch node the two links may sit
//     on different switch planes, and then both planes are lost to the pair);
//   - at zero links or fewer the pair falls back to SYS, the worst path that
//     stays inside the node: the matrix keeps only the best path of a pair,
//     so the PCIe path the traffic now takes is not known;
//   - an NVB pair (NVLink through a third GPU) with a down link at either end
//     falls back to SYS, as the route may have used that link. Down links of
//     the GPU in the middle are not seen: the matrix does not say which GPU
//     that is.
//
// downNICs holds the positions of the NICs that are down; their cells in
// NICPaths become Unknown, so NearestNIC skips them (and answers -1 where
// every NIC of a GPU is down).
//
// Entries that name no GPU or NIC of n, and counts of zero or less, are
// ignored. The copy shares with n everything it does not change (GPUs, NICs,
// Warnings, and a matrix nothing changed): neither may be modified. n itself
// is left as it was.
func (n *Node) WithHealth(downNVLinks map[int]int, downNICs map[int]bool) *Node {
	c := *n
	down := func(g int) int {
		if d := downNVLinks[g]; d > 0 && g >= 0 && g < len(n.GPUs) {
			return d
		}
		return 0
	}
	linksDown := false
	for g := range downNVLinks {
		if down(g) > 0 {
			linksDown = true
			break
		}
	}
	if linksDown && n.GPUPaths != nil {
		c.GPUPaths = make([][]Link, len(n.GPUPaths))
		for i, row := range n.GPUPaths {
			c.GPUPaths[i] = make([]Link, len(row))
			for j, l := range row {
				if i != j {
					l = degrade(l, down(i)+down(j))
				}
				c.GPUPaths[i][j] = l
			}
		}
	}

	nicsDown := false
	for k, d := range downNICs {
		if d && k >= 0 && k < len(n.NICs) {
			nicsDown = true
			break
		}
	}
	if nicsDown && n.NICPaths != nil {
		c.NICPaths = make([][]Link, len(n.NICPaths))
		for i, row := range n.NICPaths {
			c.NICPaths[i] = make([]Link, len(row))
			for k, l := range row {
				if downNICs[k] {
					l = Link{Class: Unknown}
				}
				c.NICPaths[i][k] = l
			}
		}
	}
	return &c
}

// degrade applies d down links (both ends together) to one GPU pair's link.
func degrade(l Link, d int) Link {
	if d <= 0 {
		return l
	}
	switch l.Class {
	case NV:
		if left := l.NVLinks - d; left > 0 {
			return Link{Class: NV, NVLinks: left}
		}
		return Link{Class: SYS}
	case NVB:
		return Link{Class: SYS}
	}
	return l
}
