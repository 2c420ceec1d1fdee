package bench

import (
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

// clampLog is a log scale that draws values below the axis minimum at the
// minimum, so bars (which start at 0) can be drawn on it.
type clampLog struct{}

func (clampLog) Normalize(lo, hi, x float64) float64 {
	x = math.Min(math.Max(x, lo), hi)
	return (math.Log(x) - math.Log(lo)) / (math.Log(hi) - math.Log(lo))
}

// writeChart draws two panels: throughput per contender (sustained rate,
// largest drain, producer tx/s with the relay running) and commit→receive
// latency p50/p99 at 1,000 events/s on a log scale.
func writeChart(rep *Report, path string) error {
	v := view{rep}
	names := v.contenders()
	n := len(names)
	sustained := make(plotter.Values, n)
	drain := make(plotter.Values, n)
	produce := make(plotter.Values, n)
	p50 := make(plotter.Values, n)
	p99 := make(plotter.Values, n)
	for i, c := range names {
		sustained[i] = statOf(v.find(c, "sustained", ""), func(r Result) (float64, bool) { return float64(r.Rate), true }).med
		ld, _ := v.largestDrain(c)
		drain[i] = statOf(ld, func(r Result) (float64, bool) { return r.DrainRate, r.DrainRate > 0 && !r.TimedOut }).med
		produce[i] = statOf(v.find(c, "produce", ""), func(r Result) (float64, bool) { return r.ProducerTPS, r.ProducerTPS > 0 }).med
		lat := v.find(c, "latency", "rate=1000")
		p50[i] = statOf(lat, func(r Result) (float64, bool) {
			return latOf(r, false)
		}).med
		p99[i] = statOf(lat, func(r Result) (float64, bool) {
			return latOf(r, true)
		}).med
	}
	if n == 0 {
		names = []string{"(no results)"}
		sustained, drain, produce, p50, p99 = plotter.Values{0}, plotter.Values{0}, plotter.Values{0}, plotter.Values{0}, plotter.Values{0}
	}

	barW := vg.Points(9)
	tp := plot.New()
	tp.Title.Text = "Throughput (events/s; higher is better)"
	tp.Y.Label.Text = "events/s"
	for i, s := range []struct {
		label string
		vals  plotter.Values
	}{{"sustained (ladder)", sustained}, {"drain, largest backlog", drain}, {"producer tx/s, relay running", produce}} {
		b, err := plotter.NewBarChart(s.vals, barW)
		if err != nil {
			return err
		}
		b.Offset = barW * vg.Length(i-1)
		b.Color = palette[i]
		b.LineStyle.Width = 0
		tp.Add(b)
		tp.Legend.Add(s.label, b)
	}
	tp.Legend.Top = true
	tp.Y.Min = 0
	top := 1.0
	for _, vals := range []plotter.Values{sustained, drain, produce} {
		for _, x := range vals {
			top = math.Max(top, x)
		}
	}
	tp.Y.Max = top * 1.3 // room for the legend
	tp.Y.Tick.Marker = commaTicks{}
	tp.Add(plotter.NewGrid())
	tp.NominalX(names...)
	tp.X.Tick.Label.Rotation = math.Pi / 6
	tp.X.Tick.Label.XAlign = draw.XRight

	lp := plot.New()
	lp.Title.Text = "commit→receive at 1,000 events/s (ms, log; lower is better)"
	lp.Y.Label.Text = "ms"
	maxLat := 1.0
	for i, s := range []struct {
		label string
		vals  plotter.Values
	}{{"p50", p50}, {"p99", p99}} {
		b, err := plotter.NewBarChart(s.vals, barW)
		if err != nil {
			return err
		}
		b.Offset = barW * (vg.Length(i) - 0.5)
		b.Color = palette[i]
		b.LineStyle.Width = 0
		lp.Add(b)
		lp.Legend.Add(s.label, b)
		for _, x := range s.vals {
			if x < float64(histMax)/1000 { // lost events are drawn at the top
				maxLat = math.Max(maxLat, x)
			}
		}
	}
	lp.Legend.Top = true
	lp.NominalX(names...)
	lp.X.Tick.Label.Rotation = math.Pi / 6
	lp.X.Tick.Label.XAlign = draw.XRight
	lp.Y.Scale = clampLog{}
	lp.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	lp.Y.Min = 0.1
	lp.Y.Max = math.Pow(10, math.Ceil(math.Log10(maxLat*3))) // room for the legend
	lp.Add(plotter.NewGrid())

	const w, h = 32 * vg.Centimeter, 13 * vg.Centimeter
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Centimeter, PadY: vg.Millimeter * 3, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	plots := [][]*plot.Plot{{tp, lp}}
	canvases := plot.Align(plots, tiles, dc)
	tp.Draw(canvases[0][0])
	lp.Draw(canvases[0][1])

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func latOf(r Result, p99 bool) (float64, bool) {
	if r.CommitLatency == nil {
		return 0, false
	}
	if p99 {
		return r.CommitLatency.P99, true
	}
	return r.CommitLatency.P50, true
}

// commaTicks is gonum's default ticks with labels like 25,000.
type commaTicks struct{}

func (commaTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = commas(int64(math.Round(ts[i].Value)))
		}
	}
	return ts
}
